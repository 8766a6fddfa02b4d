"""The built-in QLoRA fine-tune as a Flyte task, without user code.

Its config is the DGXTrainingJob's ``trainer`` section (the same keys as spec.trainer, camelCase),
checked by the trainer config's own model when the task is defined, so a typo fails at import of
the workflow, not on a node. The job runs the trainer image's ``dgx_trainer launch``; the task's one
output is the URI of the adapter the operator archived to the task's output mount
(``status.artifacts``), which downstream tasks can load or serve.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flytekit.configuration import SerializationSettings
from flytekit.core.base_task import PythonTask
from flytekit.core.interface import Interface
from flytekit.extend.backend.base_connector import AsyncConnectorExecutorMixin
from pydantic import ValidationError

from dgx_api.trainer_config import TrainerConfig
from flytekitplugins.dgx.config import DGXConfig, DGXConfigError, TaskConfig, check_types, to_custom
from flytekitplugins.dgx.connector import ADAPTER_OUTPUT
from flytekitplugins.dgx.manifest import QLORA_TASK
from flytekitplugins.dgx.task import with_deck


def trainer_problems(trainer: Mapping[str, Any]) -> list[str]:
    try:
        TrainerConfig.model_validate(dict(trainer))
    except ValidationError as exc:
        return [
            f"trainer.{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" if err["loc"] else f"trainer: {err['msg']}"
            for err in exc.errors()
        ]
    return []


class DGXQLoRATask(AsyncConnectorExecutorMixin, PythonTask):  # type: ignore[misc]  # untyped flytekit
    """``DGXQLoRATask(name=..., trainer={...}, task_config=DGXConfig(data=DGXDataConfig(output_mounts=[...])))``.

    ``image`` is the trainer image to run (default: the one the cluster's operator is configured with)."""

    def __init__(
        self,
        name: str,
        trainer: Mapping[str, Any],
        task_config: TaskConfig | None = None,
        image: str | None = None,
        **kwargs: Any,
    ) -> None:
        config = task_config or DGXConfig()
        check_types(config, name)
        if not isinstance(trainer, Mapping):
            raise DGXConfigError(
                name, [f"trainer: must be a mapping (the spec.trainer section), got {type(trainer).__name__}"]
            )
        problems = trainer_problems(trainer)
        if problems:
            raise DGXConfigError(name, problems)
        self._trainer = dict(trainer)
        self._image = image
        super().__init__(
            task_type=QLORA_TASK,
            name=name,
            task_config=config,
            interface=Interface(inputs={}, outputs={ADAPTER_OUTPUT: str}),
            **kwargs,
        )
        self._metadata = with_deck(self.metadata)

    @property
    def trainer(self) -> dict[str, Any]:
        return dict(self._trainer)

    def get_custom(self, settings: SerializationSettings) -> dict[str, Any]:
        custom = to_custom(self.task_config, self._trainer)
        if self._image:
            custom["image"] = self._image
        return custom
