"""The kubedgx trainer: QLoRA fine-tuning under torchrun (``torchrun -m dgx_trainer``).

It reads its config through the shared contract (:mod:`dgx_api.trainer_config`) and reports through
:mod:`dgx_api.progress`; it never imports the operator. Importing this package imports neither torch
nor transformers, so ``--help`` and config errors come back fast.
"""

__version__ = "0.1.0"
