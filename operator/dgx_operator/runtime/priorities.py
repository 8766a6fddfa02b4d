"""The PriorityClasses that workers name (``spec.priority`` -> ``priorityClassName``): the three the
no-Helm path applies (``kubedgx manifests``), and the operator's check at startup that the classes it
is configured with exist.

Why the check: the apiserver's Priority admission plugin refuses every pod that names a PriorityClass
that does not exist, and the operator names the chart's three classes unless told otherwise. On a
cluster set up without Helm (the CRDs applied, ``kubedgx operator`` run from a laptop) nobody created
them, so every worker of every job was refused and each job ended Failed (CreateRefused). Now a class
that the apiserver says does not exist (404) is dropped before any job is reconciled: the workers of
that priority name no class and get the cluster's default priority, exactly as if the admin had mapped
that priority to none (``KUBEDGX_PRIORITY_CLASSES``), and one WARNING names the classes and the fix.

An answer that does not settle the question (403 from RBAC, a 5xx, a timeout) keeps the class: on a
cluster where it does exist, dropping it would quietly change the priority of every job, which is worse
than a refusal the job's condition explains. The log says the check could not be made, and why.

The check runs once, at startup, like the rest of the operator's configuration: a class created later
is used after the operator restarts (the WARNING says so).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the manifests need neither kopf (settings) nor a cluster client (kube)
    from dgx_operator.kube import Kube
    from dgx_operator.runtime.settings import OperatorConfig

log = logging.getLogger(__name__)

#: The chart's PriorityClasses (charts/kubedgx/values.yaml ``priorityClasses``; tests keep them equal,
#: and equal to settings.DEFAULT_PRIORITY_CLASSES): priority -> (name, value).
CHART_CLASSES: Mapping[str, tuple[str, int]] = {
    "low": ("kubedgx-low", 1000),
    "normal": ("kubedgx-normal", 10000),
    "high": ("kubedgx-high", 100000),
}
LABELS = {"app.kubernetes.io/name": "kubedgx", "app.kubernetes.io/part-of": "kubedgx"}
#: How the no-Helm path creates them (the fix the WARNING names).
APPLY_COMMAND = "kubedgx manifests | kubectl apply -f -"


def priority_class_manifests() -> list[dict[str, Any]]:
    """The chart's three PriorityClasses as its template renders them (labels aside): applied without
    Helm, jobs get the same scheduling order as with the chart, and a later `helm install` with
    ``priorityClasses.create=false`` finds what it expects."""
    return [
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": name, "labels": dict(LABELS)},
            "value": value,
            "globalDefault": False,
            "description": f"kubedgx training workers of spec.priority {level}.",
        }
        for level, (name, value) in CHART_CLASSES.items()
    ]


#: GET one PriorityClass: its value, or None when the apiserver answers 404; raises otherwise.
Getter = Callable[[str], Awaitable[int | None]]


@dataclass(frozen=True)
class Check:
    """What the apiserver said about each configured class (priority -> class name)."""

    configured: Mapping[str, str]
    missing: Mapping[str, str]
    #: Classes whose existence could not be read, with the error: kept.
    unknown: Mapping[str, str]

    @property
    def usable(self) -> dict[str, str]:
        """The mapping the operator goes on with: the configured one less the missing classes."""
        return {level: name for level, name in self.configured.items() if level not in self.missing}

    def warnings(self) -> list[str]:
        """At most two lines: the missing classes with the fix, and the classes that could not be checked."""
        out = []
        if self.missing:
            out.append(_missing_warning(self.missing))
        if self.unknown:
            listed = "; ".join(
                f"{self.configured[level]} (spec.priority {level}): {error}" for level, error in self.unknown.items()
            )
            out.append(
                f"could not check that the workers' PriorityClasses exist ({listed}); kept as configured. If one "
                "does not exist, the apiserver refuses those workers (the job fails with CreateRefused). "
                "The operator needs `get` on scheduling.k8s.io priorityclasses to check."
            )
        return out


def _missing_warning(missing: Mapping[str, str]) -> str:
    names = sorted(set(missing.values()))
    levels = ", ".join(f"{name} (spec.priority {level})" for level, name in missing.items())
    subject = f"PriorityClass {levels} does" if len(missing) == 1 else f"PriorityClasses {levels} do"
    ours = {name for name, _ in CHART_CLASSES.values()}
    if set(names) <= ours:
        create = f"create {'it' if len(names) == 1 else 'them'} with `{APPLY_COMMAND}` (or install the Helm chart)"
    else:
        create = "create " + " and ".join(f"`kubectl create priorityclass {n} --value=N`" for n in names)
    return (
        f"{subject} not exist: workers of those jobs get no priorityClassName (the cluster's default priority) "
        f"instead of being refused by the apiserver. To fix, {create} and restart the operator, or name existing "
        "classes with --priority-classes / KUBEDGX_PRIORITY_CLASSES ('' for none)."
    )


async def check(classes: Mapping[str, str], get: Getter) -> Check:
    """Ask for each distinct class once, concurrently."""
    names = sorted(set(classes.values()))
    answers = await asyncio.gather(*(get(name) for name in names), return_exceptions=True)
    by_name = dict(zip(names, answers, strict=True))
    missing: dict[str, str] = {}
    unknown: dict[str, str] = {}
    for level, name in classes.items():
        answer = by_name[name]
        if isinstance(answer, Exception):
            # Whatever went wrong (RBAC, the network, a server error), the class may well exist.
            unknown[level] = _describe(answer)
        elif isinstance(answer, BaseException):  # cancelled: the operator is stopping
            raise answer
        elif answer is None:
            missing[level] = name
    return Check(configured=dict(classes), missing=missing, unknown=unknown)


def _describe(exc: BaseException) -> str:
    status = getattr(exc, "status", None)
    reason = getattr(exc, "reason", None)
    if isinstance(status, int):
        return f"HTTP {status} {reason or ''}".strip()
    return str(exc) or type(exc).__name__


async def checked(config: OperatorConfig, kube: Kube) -> OperatorConfig:
    """``config`` with the PriorityClasses that do not exist dropped, the reasons logged; unchanged
    when every class exists or none is configured."""
    if not config.priority_classes:
        return config

    async def get(name: str) -> int | None:
        return await kube.priority_value("scheduling.k8s.io", "v1", "priorityclasses", name)

    result = await check(config.priority_classes, get)
    for line in result.warnings():
        log.warning("%s", line)
    if not result.missing:
        if not result.unknown:
            shown = ", ".join(f"{level}={name}" for level, name in config.priority_classes.items())
            log.info("workers' PriorityClasses exist: %s", shown)
        return config
    return dataclasses.replace(config, priority_classes=result.usable)
