"""Flyte tasks on kubedgx.

Importing the package (flytekit does, through the ``flytekit.plugins`` entry point) registers the
task plugins for DGXConfig, DGXTorchElastic and DGXDataConfig and the ``kubedgx`` connector for
both task types, ``dgx_training`` (a @task function) and ``dgx_qlora`` (the built-in fine-tune).
"""

from flytekitplugins.dgx.config import (
    MOUNT_ROOT,
    DGXConfig,
    DGXConfigError,
    DGXDataConfig,
    DGXTorchElastic,
    input_path,
    output_path,
)
from flytekitplugins.dgx.connector import DGXConnector, DGXJobMetadata, register
from flytekitplugins.dgx.image import DGXImageSpec, ImageSpecError, dgx_image_spec
from flytekitplugins.dgx.qlora import DGXQLoRATask
from flytekitplugins.dgx.task import DGXFunctionTask

__version__ = "0.1.0"

register()

__all__ = [
    "MOUNT_ROOT",
    "DGXConfig",
    "DGXConfigError",
    "DGXConnector",
    "DGXDataConfig",
    "DGXFunctionTask",
    "DGXImageSpec",
    "DGXJobMetadata",
    "DGXQLoRATask",
    "DGXTorchElastic",
    "ImageSpecError",
    "dgx_image_spec",
    "input_path",
    "output_path",
]
