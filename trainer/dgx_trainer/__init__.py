"""The kubedgx trainer: QLoRA fine-tuning under torchrun, and the config contract it shares with
the operator. Importing this package imports neither torch nor transformers."""

__version__ = "0.1.0"
