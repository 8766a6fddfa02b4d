"""kubedgx: the operator and the user CLI. It stands on the shared contract (:mod:`dgx_api`) and the
data plane (:mod:`dgx_datasync`), never on the trainer, and nothing under this package imports torch."""

__version__ = "0.1.0"
