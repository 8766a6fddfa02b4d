"""kubedgx: the operator and the user CLI. Nothing under this package imports torch."""

__version__ = "0.1.0"
