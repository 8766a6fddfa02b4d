"""kubedgx's shared contract: what the operator, the trainer and the data plane agree on.

- :mod:`dgx_api.schema`: the schema engine. Pydantic models declare their fields and CEL rules once;
  it turns them into CRD structural schemas and validates objects the way the API server does.
- :mod:`dgx_api.trainer_config`: :class:`~dgx_api.trainer_config.TrainerConfig`, the trainer's
  config, embedded as ``spec.trainer`` of a DGXTrainingJob and read by the trainer from a ConfigMap.
- :mod:`dgx_api.progress`: progress lines, ``progress.json`` and the termination message that the
  operator copies into ``status.progress``.
- :mod:`dgx_api.history`: the progress history (``history/*.jsonl``, every progress line of a run)
  read back as one point per step, for loss curves.
- :mod:`dgx_api.checkpoints`: which checkpoint directories are complete, for the trainer's resume
  and the data plane's uploader alike.

It stands on nothing of kubedgx's and imports no torch, kopf, cluster client or object-storage
client (import-linter contracts in pyproject.toml), so every image can install it.
"""

__version__ = "0.1.0"
