"""Whether a job that can be restarted in a new pod keeps its checkpoints where that pod finds them.

The built-in trainer writes checkpoint-<step>/ into its output.dir and resumes from the newest
complete one it finds there (the one every rank has). A restart in the same pod (torchrun's
maxRestarts) finds them; a new pod finds only what survived the old one. The only place that
survives every replacement is object storage: a DGXDataMount with direction Out and
syncCheckpoints (its sidecar uploads each complete checkpoint, its restore init container brings
the newest back into the new pod). Anything else (an emptyDir, the container's own file system, an
Out mount's node directory without syncCheckpoints) is gone with the pod or stays on its node, and
a replacement elsewhere starts at step 0: hours of GPU time on a spot reclaim, silently.

So this is a warning, not a refusal: the job is valid and may be meant that way (a short run that
is cheap to repeat). It says which field to change instead.

Which jobs: those that can be replaced in a new pod as a matter of course, i.e. spot capacity
(reclaims), restartPolicy OnFailure or ExitCode (a failed worker is recreated) and elastic jobs
(workers come and go between minNodes and maxNodes). Not interactive debug jobs (the worker idles;
nothing trains) nor jobs on the debug pool (short experiments whose progress nobody resumes), and
not a restartPolicy Never job on norm capacity with a fixed node count: that one ends at its first
failure. (Node loss and evictions replace the workers of every job, Never included; a job that
chose Never and norm capacity has said that it does not count on a resumption.)

Only spec.trainer jobs. A spec.command program checkpoints wherever it likes, often straight to
object storage or a network file system with its own client; the Out mount's sidecar uploads only
checkpoint-<step>/ directories carrying kubedgx's completion marker, which the built-in trainer
writes and an arbitrary program does not. Neither the presence nor the absence of an Out mount says
whether such a job resumes, and a warning its author can silence only by adding a mount they do not
need would be noise on every `kubectl apply`. docs/api.md says what a command job must do instead.

Pure: the caller gives the referenced mounts (from the same files for `kubedgx validate`, from the
cluster for the webhook). When one is missing the rule says nothing rather than guess.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping
from typing import Any

from dgx_api.schema import Problem
from dgx_operator.api import DGXDataMountSpec, DGXTrainingJob
from dgx_operator.api.trainingjob import DataMountRef, DGXTrainingJobSpec
from dgx_operator.catalog import Catalog, UnknownInstanceError
from dgx_operator.render.datasync import syncs_checkpoints
from dgx_operator.render.resolved import Resolved, resolve
from dgx_operator.validation.validator import jobs_with_mounts

#: Capacity pools (the last part of an instance name) whose jobs are not expected to resume.
NO_RESUME_CAPACITIES = ("debug",)


def restart_reasons(spec: DGXTrainingJobSpec, r: Resolved) -> list[str]:
    """Why this job's workers can be replaced by new pods in the normal course of things, as the
    warning states them; empty when they are not (see the module's docstring)."""
    if r.interactive or r.instance.capacity in NO_RESUME_CAPACITIES:
        return []
    reasons: list[str] = []
    if r.instance.capacity == "spot":
        reasons.append("spot capacity")
    if spec.restart_policy != "Never":
        # OnFailure is the default: say so, or the user looks in vain for it in the manifest.
        default = "" if "restart_policy" in spec.model_fields_set else ", the default"
        reasons.append(f"restartPolicy {spec.restart_policy}{default}")
    if r.elastic:
        reasons.append(f"elastic between {r.min_nodes} and {r.max_nodes} nodes")
    return reasons


def _contains(mount_path: str, path: str) -> bool:
    """As the builders decide it (render/datasync.py): ``path`` is ``mount_path`` or below it."""
    root = mount_path.rstrip("/") or "/"
    return path == root or path.startswith(root.rstrip("/") + "/")


def _holder(refs: list[DataMountRef], out: str) -> tuple[int, DataMountRef] | None:
    """The mount whose volume holds ``out``: the deepest one containing it (a mount nested in
    another has a volume of its own), as render/ mounts them and the checkpoint sidecar watches."""
    holders = [(i, ref) for i, ref in enumerate(refs) if _contains(ref.mount_path, out)]
    return max(holders, key=lambda h: len(h[1].mount_path.rstrip("/")), default=None)


def checkpoint_warnings(job: DGXTrainingJob, r: Resolved, mounts: Mapping[str, DGXDataMountSpec]) -> list[Problem]:
    """The warning for a restartable spec.trainer job whose checkpoints would not reach a new pod,
    naming the field to change; [] when they would, when the job is not restartable, for command
    jobs, and when a referenced mount is not in ``mounts`` (unknown: nothing is said)."""
    spec = job.spec
    if spec.trainer is None:
        return []
    reasons = restart_reasons(spec, r)
    if not reasons or any(ref.name not in mounts for ref in spec.data_mounts):
        return []
    out = spec.trainer.output.dir
    why = f"this job can be restarted in a new pod ({', '.join(reasons)})"
    lost = "a replacement starts at step 0"
    # A job restartable only by its policy can also stop being restartable: offer that too.
    only_policy = all(reason.startswith("restartPolicy") for reason in reasons)
    never = "; or set restartPolicy: Never if a failed run should end the job" if only_policy else ""
    refs = list(spec.data_mounts)
    syncing = [(i, ref) for i, ref in enumerate(refs) if syncs_checkpoints(mounts[ref.name])]
    if not out.startswith("/"):
        if syncing:
            _, ref = syncing[0]
            return [
                Problem(
                    "spec.trainer.output.dir",
                    f"{why}, but output.dir {out} is relative: it resolves against the image's working directory, "
                    f"which kubedgx cannot see, so the checkpoint upload of DGXDataMount {ref.name} watches its "
                    f"mountPath {ref.mount_path} instead and a replacement may start at step 0. Set output.dir to an "
                    f"absolute path inside {ref.mount_path}, e.g. {posixpath.join(ref.mount_path, out)}",
                )
            ]
        holder = None
    else:
        holder = _holder(refs, out)
    if holder is not None:
        i, ref = holder
        mount = mounts[ref.name]
        if syncs_checkpoints(mount) or mount.direction != "Out":
            # Uploaded; or inside an input mount, which workers see read-only: refused elsewhere.
            return []
        return [
            Problem(
                f"spec.dataMounts[{i}]",
                f"{why}, but DGXDataMount {ref.name}, which holds its checkpoints (output.dir {out}), has "
                "syncCheckpoints: false: they stay on the node, and a replacement on another node starts at step 0. "
                f"Set syncCheckpoints: true in DGXDataMount {ref.name} (or leave it out: it defaults to true){never}",
            )
        ]
    if syncing:
        _, ref = syncing[0]
        return [
            Problem(
                "spec.trainer.output.dir",
                f"{why}, but its checkpoints (output.dir {out}) are outside {ref.mount_path}, where DGXDataMount "
                f"{ref.name} uploads them from: they stay in the pod and {lost}. Set output.dir to "
                f"{ref.mount_path} or a directory below it{never}",
            )
        ]
    at = out if out.startswith("/") else posixpath.join("/output", out)
    return [
        Problem(
            "spec.dataMounts",
            f"{why}, but its checkpoints (output.dir {out}) stay in the pod: {lost}. Add a DGXDataMount with "
            f"direction: Out and syncCheckpoints: true, mounted at {at} or a directory above it"
            + ("" if out.startswith("/") else f", and set output.dir to {at}")
            + never,
        )
    ]


def reference_warnings(catalog: Catalog, objects: Iterable[tuple[Mapping[str, Any], Any]]) -> list[tuple[Any, Problem]]:
    """:func:`checkpoint_warnings` for the jobs among ``(object, key)`` pairs of valid objects, with
    the DGXDataMounts given among them (in the job's namespace, as :func:`reference_problems` finds
    them). A job referencing a mount not given gets no warning. Returns (key, warning)."""
    out: list[tuple[Any, Problem]] = []
    for key, job, found in jobs_with_mounts(objects):
        try:
            r = resolve(job.spec, catalog)
        except UnknownInstanceError:  # refused by the validator already
            continue
        out += [(key, warning) for warning in checkpoint_warnings(job, r, found)]
    return out
