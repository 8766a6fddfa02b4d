"""kubectl as a subprocess, with JSON output: the e2e tests' only way to talk to the cluster.

No Python Kubernetes client: kubectl is what users run, it needs no dependency of ours, and every
call names its ``--context`` explicitly, so a test can never drift onto whatever context becomes
current while it runs.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from tests.support.wait import wait_until

T = TypeVar("T")

JOBS = "dgxtrainingjobs.kubedgx.io"
MOUNTS = "dgxdatamounts.kubedgx.io"


class KubectlError(RuntimeError):
    """kubectl exited non-zero; ``stderr`` is what it said."""

    def __init__(self, args: Sequence[str], returncode: int, stdout: str, stderr: str) -> None:
        super().__init__(f"kubectl {' '.join(args)} exited {returncode}: {stderr.strip() or stdout.strip()}")
        self.args_ = list(args)
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr

    @property
    def not_found(self) -> bool:
        return "(NotFound)" in self.stderr or " not found" in self.stderr


def kubectl_binary() -> str | None:
    return shutil.which("kubectl")


@dataclass(frozen=True)
class Kubectl:
    """kubectl bound to one context (always) and one namespace (optionally)."""

    context: str
    namespace: str | None = None
    binary: str = "kubectl"
    #: Per-request timeout kubectl passes to the API server and its own client.
    request_timeout: str = "30s"
    #: The kubeconfig file (None: kubectl's own choice, $KUBECONFIG or ~/.kube/config).
    kubeconfig: str | None = None

    def in_namespace(self, namespace: str | None) -> Kubectl:
        return Kubectl(self.context, namespace, self.binary, self.request_timeout, self.kubeconfig)

    def base_args(self) -> list[str]:
        args = [self.binary, "--context", self.context, f"--request-timeout={self.request_timeout}"]
        if self.kubeconfig:
            args += ["--kubeconfig", self.kubeconfig]
        if self.namespace:
            args += ["--namespace", self.namespace]
        return args

    def run(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 90
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [*self.base_args(), *args], input=input, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and proc.returncode != 0:
            raise KubectlError(args, proc.returncode, proc.stdout, proc.stderr)
        return proc

    def get_json(self, *args: str) -> Any:
        return json.loads(self.run(*args, "-o", "json").stdout)

    def get(self, kind: str, name: str) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        try:
            obj: dict[str, Any] = self.get_json("get", kind, name)
        except KubectlError as exc:
            if exc.not_found:
                return None
            raise
        return obj

    def select(self, kind: str, selector: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
        args = ["get", kind]
        if selector:
            args += ["-l", ",".join(f"{k}={v}" for k, v in selector.items())]
        items: list[dict[str, Any]] = self.get_json(*args).get("items", [])
        return items

    def apply(self, *manifests: Mapping[str, Any], check: bool = True) -> subprocess.CompletedProcess[str]:
        # JSON, not PyYAML's YAML 1.1: a string like 839e12 goes out unquoted there and kubectl's
        # YAML 1.2 reads it back as a number (seen: a random label value refused by the apiserver).
        text = json.dumps({"apiVersion": "v1", "kind": "List", "items": [dict(m) for m in manifests]})
        return self.run("apply", "-f", "-", input=text, check=check)

    def patch(self, kind: str, name: str, patch: Mapping[str, Any], *, type_: str = "merge") -> None:
        self.run("patch", kind, name, "--type", type_, "-p", json.dumps(patch))

    def delete(self, kind: str, name: str, *, wait: bool = False) -> None:
        self.run("delete", kind, name, "--ignore-not-found", f"--wait={'true' if wait else 'false'}")

    def events_for(self, kind: str, name: str) -> list[dict[str, Any]]:
        """Core v1 Events about one object of this namespace, oldest first."""
        events = [
            e
            for e in self.select("events")
            if dig(e, "involvedObject", "kind") == kind and dig(e, "involvedObject", "name") == name
        ]
        return sorted_events(events)

    def logs(self, pod: str, *, container: str | None = None, tail: int = 50) -> str:
        args = ["logs", pod, f"--tail={tail}"]
        if container:
            args += ["-c", container]
        proc = self.run(*args, check=False)
        return proc.stdout if proc.returncode == 0 else proc.stderr


#: What a probe may raise that means "look again": an API hiccup.
NOT_YET: tuple[type[BaseException], ...] = (KubectlError, subprocess.TimeoutExpired)


def wait_for(
    what: str,
    probe: Callable[[], T | None],
    *,
    timeout: float,
    interval: float = 2.0,
    diagnose: Callable[[], str] | None = None,
) -> T:
    """tests.support.wait.wait_until with ``what`` first, kubectl's errors (NOT_YET) as "look
    again", and a slower default pace (each look runs kubectl). The result is the probe's first
    true value (None, False, 0, "", [] and {} all mean "not yet").

    ``interval`` is only the pace of the polling: the wait ends on the condition or the timeout,
    never on a fixed sleep. On timeout the WaitTimeoutError names ``what``, the last value seen and,
    when given, ``diagnose()``'s account of the cluster. A probe may raise AssertionError to fail
    early (a job that went Failed while we wait for Succeeded)."""
    return wait_until(probe, timeout=timeout, what=what, interval=interval, retry_on=NOT_YET, diagnose=diagnose)


def dig(obj: Mapping[str, Any] | None, *path: str | int, default: Any = None) -> Any:
    """obj[path[0]][path[1]]..., or ``default`` where anything is missing."""
    cur: Any = obj
    for part in path:
        if isinstance(part, int):
            if not isinstance(cur, list) or part >= len(cur):
                return default
            cur = cur[part]
        else:
            if not isinstance(cur, Mapping) or part not in cur:
                return default
            cur = cur[part]
    return cur


def condition(obj: Mapping[str, Any] | None, type_: str) -> dict[str, Any] | None:
    for cond in dig(obj, "status", "conditions", default=[]) or []:
        if cond.get("type") == type_:
            return dict(cond)
    return None


def sorted_events(events: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Oldest first (kopf fills lastTimestamp; events.k8s.io writers fill eventTime)."""
    return sorted((dict(e) for e in events), key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))


def reasons(events: Iterable[Mapping[str, Any]]) -> list[str]:
    return [str(e.get("reason")) for e in events]
