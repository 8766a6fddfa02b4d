"""The kubedgx.io/v1alpha1 API: pydantic models of both kinds, the single source of truth for the
CRDs (:mod:`dgx_operator.api.crdgen`), the CLI's validation and the operator's builders."""

from dgx_operator.api.common import API_VERSION, GROUP, VERSION, Condition, parse_duration
from dgx_operator.api.datamount import DGXDataMount, DGXDataMountSpec, DGXDataMountStatus
from dgx_operator.api.trainingjob import (
    DGXTrainingJob,
    DGXTrainingJobSpec,
    DGXTrainingJobStatus,
)

__all__ = [
    "API_VERSION",
    "GROUP",
    "VERSION",
    "Condition",
    "DGXDataMount",
    "DGXDataMountSpec",
    "DGXDataMountStatus",
    "DGXTrainingJob",
    "DGXTrainingJobSpec",
    "DGXTrainingJobStatus",
    "parse_duration",
]
