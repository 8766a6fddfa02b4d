"""The CRD files on a real apiserver, and every bad manifest of tests/unit/test_bad_input.py sent to it.

``crds/*.yaml`` (what ``kubectl apply -f crds/`` installs) must be accepted and become Established;
the base manifests must be accepted; every row of layers ``crd`` and ``apiserver`` must be refused by
the apiserver itself, and every row of layers ``webhook`` and ``catalog`` accepted (those rules live in
the admission webhook, which is not installed here). Manifests are built by test_bad_input.py's own
:func:`manifest` and sent as kubectl sends them (``fieldValidation=Strict``), as a server-side dry run.

What "identical to ``kubedgx validate``" means here. A row pins the path and the message (a substring)
that the CLI prints; the apiserver answers a Status whose ``details.causes`` carry a field and a
message each. A row is *identical* when

1. some cause has ``field`` equal to the row's path and a message that contains the row's message, and
2. every other cause is at that same path, or is the apiserver's own note that it skipped the CEL rules
   ("some validation rules were not checked ...", field ``<nil>``), which only means that a blocking
   error came first.

It *differs* otherwise: another path, other wording, or a further cause elsewhere (the apiserver runs
CEL rules even after a ``pattern`` failure, so it can report an error that ``kubedgx validate`` does
not). A refusal without causes (a 400 from the decoder) counts as one cause with no field. Every row
that differs is listed in :data:`KNOWN_DIFFERENCES` with the apiserver's field and a substring of its
message, and both directions are checked: a difference not in the table fails, and an entry whose row
no longer differs, or whose recorded apiserver cause is gone, fails too. docs/apiserver-validation.md
explains the table.
"""

from __future__ import annotations

import functools
import json
import secrets
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from dgx_operator.catalog import Catalog
from tests.cluster.controlplane import ControlPlane
from tests.conftest import BASE_JOB, BASE_MOUNT, CRDS, EXAMPLES, load_yaml_docs, with_changes
from tests.e2e.kubectl import Kubectl, KubectlError, condition, dig, wait_for
from tests.unit.bad_input_rows import APISERVER_ROWS, CATALOG_ROWS, CRD_ROWS, ROWS, WEBHOOK_ROWS, Row, manifest

#: What the apiserver itself refuses: the CRD's schema and rules, and its own ObjectMeta checks.
REFUSED_ROWS = CRD_ROWS + APISERVER_ROWS
#: What it accepts (the webhook, not installed here, refuses them).
ACCEPTED_ROWS = WEBHOOK_ROWS + CATALOG_ROWS

#: The field manager the CRDs are applied with (server-side, so another module's install is no conflict).
MANAGER = "kubedgx-crd-tests"
CRD_FILES = sorted(CRDS.glob("*.yaml"))
#: The apiserver's note after a blocking error (field ``<nil>`` on the wire): CEL rules were skipped.
NOT_CHECKED = "some validation rules were not checked"


class Cause(NamedTuple):
    """One cause of a refusal; ``field`` None where the apiserver names none."""

    field: str | None
    message: str


class Difference(NamedTuple):
    """How the apiserver's answer to a row differs from ``kubedgx validate``: it reports ``field``
    (None: no field) with a message containing ``message``; ``why`` says why."""

    field: str | None
    message: str
    why: str


_PATTERN = "the apiserver prints the schema's regular expression; kubedgx validate explains it in words"

#: Every crd row whose apiserver answer differs from kubedgx validate (see the module docstring).
KNOWN_DIFFERENCES: dict[str, Difference] = {
    "instance-malformed": Difference(
        "spec.instance", 'Invalid value: "a100-8": spec.instance in body should match', _PATTERN
    ),
    "max-duration-not-duration": Difference(
        "spec.maxDuration", 'Invalid value: "1 day": spec.maxDuration in body should match', _PATTERN
    ),
    "max-pending-bare-number": Difference(
        "spec.maxPending", 'Invalid value: "90": spec.maxPending in body should match', _PATTERN
    ),
    "elastic-unknown-field": Difference(
        None,
        'strict decoding error: unknown field "spec.elastic.minNode"',
        "refused by the decoder (400 BadRequest, no causes): the path is only inside the message, and no "
        "'did you mean' hint",
    ),
    "metadata-unknown-field": Difference(
        None,
        'strict decoding error: unknown field "metadata.bogus"',
        "refused by the decoder (400 BadRequest, no causes), as an unknown spec field is",
    ),
    "memory-not-quantity": Difference("spec.resources.memory", "spec.resources.memory in body should match", _PATTERN),
    "memory-negative": Difference(
        "spec.resources.memory", 'Invalid value: "-1Gi": spec.resources.memory in body should match', _PATTERN
    ),
    "mount-path-relative": Difference("spec.dataMounts[0].mountPath", "in body should match '^/", _PATTERN),
    "name-upper-case": Difference(
        "metadata.name",
        "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters",
        "two causes at metadata.name: the apiserver's own object-name check (RFC 1123 subdomain, which allows "
        "'.') and the CRD's DNS-1035 pattern as a regular expression",
    ),
    "name-too-long": Difference(
        "metadata.name",
        "Too long: may not be more than 50 bytes",
        "the apiserver's maxLength wording ('bytes', without the length)",
    ),
    "mount-source-http": Difference(
        "spec.source", 'Invalid value: "http://bucket/x": spec.source in body should match', _PATTERN
    ),
    "mount-source-upper-case-bucket": Difference(
        "spec.source", 'Invalid value: "s3://B": spec.source in body should match', _PATTERN
    ),
}

#: Rows the apiserver refuses before validation (the decoder: 400 BadRequest); all others get 422 Invalid.
DECODER_REFUSES = frozenset({"elastic-unknown-field", "metadata-unknown-field"})


# -- the apiserver's answers ------------------------------------------------------------------------


def _crd(path: Path) -> dict[str, Any]:
    docs = load_yaml_docs(path)
    assert len(docs) == 1, f"{path.name}: expected one document"
    crd: dict[str, Any] = docs[0]
    return crd


#: kind -> (group/version, plural), from the CRD files.
RESOURCES: dict[str, tuple[str, str]] = {
    dig(c, "spec", "names", "kind"): (f"{c['spec']['group']}/{c['spec']['versions'][0]['name']}",
                                      dig(c, "spec", "names", "plural"))
    for c in map(_crd, CRD_FILES)
}  # fmt: skip


def causes(answer: Any) -> list[Cause]:
    """The causes of a refusal; a Status without any (a decoder error) is one cause without a field."""
    found = dig(answer, "details", "causes", default=None) or []
    if not found:
        return [Cause(None, str(dig(answer, "message", default=answer)))]
    out = []
    for c in found:
        field = c.get("field")
        out.append(Cause(None if field in (None, "", "<nil>") else str(field), str(c.get("message", ""))))
    return out


def identical(row: Row, found: Sequence[Cause]) -> bool:
    """The module docstring's rule: the row's path and message are there, and nothing else is."""
    hit = any(c.field == row.path and row.message in c.message for c in found)
    rest = [c for c in found if c.field != row.path and not (c.field is None and NOT_CHECKED in c.message)]
    return hit and not rest


def shown(found: Sequence[Cause]) -> str:
    return "\n".join(f"  {c.field or '<no field>'}: {c.message}" for c in found)


@dataclass(frozen=True)
class Installed:
    """One CRD file as the apiserver took it: refused (its error), or the stored object once Established."""

    file: Path
    name: str
    error: str | None
    stored: dict[str, Any] | None


def established(kubectl: Kubectl, name: str) -> dict[str, Any] | None:
    """The stored CRD once its Established and NamesAccepted conditions are True, else None."""
    crd = kubectl.get("customresourcedefinition", name)
    ok = crd is not None and all(dig(condition(crd, t), "status") == "True" for t in ("Established", "NamesAccepted"))
    return crd if ok else None


@pytest.fixture(scope="module")
def crds(kubectl: Kubectl) -> dict[str, Installed]:
    """Both CRD files applied server-side (idempotent: another module may have installed them), each
    waited for until Established and NamesAccepted; keyed by kind. A refusal or a timeout is recorded,
    not raised: test_crd_is_established reports it, and every test of that kind fails with it."""
    out: dict[str, Installed] = {}
    for path in CRD_FILES:
        crd = _crd(path)
        name, kind = crd["metadata"]["name"], crd["spec"]["names"]["kind"]
        try:
            kubectl.run("apply", "--server-side", "--force-conflicts", f"--field-manager={MANAGER}", "-f", str(path))
            stored = wait_for(
                f"CRD {name} Established and NamesAccepted",
                functools.partial(established, kubectl, name),
                timeout=60,
                interval=0.3,
            )
        except (KubectlError, AssertionError) as exc:
            out[kind] = Installed(path, name, str(exc), None)
        else:
            out[kind] = Installed(path, name, None, stored)
    return out


@pytest.fixture(scope="module")
def test_namespace(kubectl: Kubectl) -> Iterator[str]:
    """One namespace for the module's dry runs (nothing is stored, so nothing needs a fresh one)."""
    name = f"t-crds-{secrets.token_hex(3)}"
    kubectl.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    yield name
    kubectl.run("delete", "namespace", name, "--wait=false", "--ignore-not-found")


def ready(crds: Mapping[str, Installed], kind: str) -> None:
    installed = crds[kind]
    if installed.error is not None:
        pytest.fail(f"{installed.file.name} is not installed, so nothing of kind {kind} can be checked: "
                    f"{installed.error}", pytrace=False)  # fmt: skip


def in_namespace(doc: Mapping[str, Any], namespace: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(json.dumps(doc))
    out["metadata"]["namespace"] = namespace
    return out


def dry_run(plane: ControlPlane, namespace: str, doc: Mapping[str, Any]) -> tuple[int, Any]:
    """POST ``doc`` as a server-side dry run with strict field validation (what kubectl sends)."""
    group_version, plural = RESOURCES[doc["kind"]]
    path = f"/apis/{group_version}/namespaces/{namespace}/{plural}?dryRun=All&fieldValidation=Strict"
    return plane.request("POST", path, in_namespace(doc, namespace))


# -- the CRDs and the bases -------------------------------------------------------------------------


@pytest.mark.parametrize("path", CRD_FILES, ids=[p.name for p in CRD_FILES])
def test_crd_is_established(path: Path, crds: dict[str, Installed]) -> None:
    (installed,) = [i for i in crds.values() if i.file == path]
    assert installed.error is None, f"the apiserver did not take {path.name}: {installed.error}"
    assert installed.stored is not None
    for type_ in ("Established", "NamesAccepted"):
        assert dig(condition(installed.stored, type_), "status") == "True", installed.stored.get("status")
    # What is served is this file's schema, not another module's older copy.
    assert installed.stored["spec"]["versions"] == _crd(path)["spec"]["versions"]


@pytest.mark.parametrize("base", [BASE_JOB, BASE_MOUNT], ids=["job", "mount"])
def test_base_manifest_is_accepted(base: dict[str, Any], crds: dict[str, Installed], kubectl: Kubectl,
                                   test_namespace: str) -> None:  # fmt: skip
    ready(crds, base["kind"])
    doc = in_namespace(base, test_namespace)
    out = kubectl.in_namespace(test_namespace).run("apply", "--dry-run=server", "-f", "-", input=json.dumps(doc))
    assert f"{doc['metadata']['name']} created (server dry run)" in out.stdout


# -- MIG instances and the instance rules ------------------------------------------------------------

#: Every MIG instance type of the shipped catalog (dgxa100.80g.mig-1g.10gb.debug, ...).
MIG_INSTANCES = sorted(name for name, inst in Catalog.load().instances.items() if inst.mig is not None)
#: Names the apiserver's CEL rules must answer without an evaluation error: malformed ones (the pattern
#: refuses them, and the apiserver still runs the rules), and the extremes of the pattern.
ODD_INSTANCES = [
    "a100-8",
    "dgx",
    "dgxa100.80g",
    "dgxa100.80g.0.norm",
    "dgxa100.80g.100.norm",
    "dgxa.1g.99999999999999999999.norm",
    "dgxa100.80g.mig-1g.norm",
    "x.y.mig-1g.10gb.norm",
    "dgxa.0g.99.spot",
    "dgxz9.999999g.mig-7g.999999gb.me.debug",
]
#: What the rules read beside the instance.
BESIDE_THE_INSTANCE: list[dict[str, Any]] = [
    {},
    {"spec.resources.gpu": 1},
    {"spec.elastic.nprocPerNode": 2},
    {"spec.resources.gpu": 2, "spec.elastic": {"minNodes": 2, "maxNodes": 3, "nprocPerNode": 3}},
]
#: How the apiserver reports a rule that failed to evaluate (an index, a conversion): "... evaluating rule: <message>".
EVALUATION_ERROR = " evaluating rule: "


def test_mig_jobs_are_accepted(control_plane: ControlPlane, crds: dict[str, Installed], kubectl: Kubectl,
                               test_namespace: str) -> None:  # fmt: skip
    """examples/mig-debug.yaml by ``kubectl apply --dry-run=server``, and every MIG instance type of
    the catalog, alone and with the one worker of one process spelled out."""
    ready(crds, "DGXTrainingJob")
    out = kubectl.in_namespace(test_namespace).run("apply", "--dry-run=server", "-f", str(EXAMPLES / "mig-debug.yaml"))
    assert "mig-debug created (server dry run)" in out.stdout
    assert MIG_INSTANCES
    refused = []
    for name in MIG_INSTANCES:
        for beside in ({}, {"spec.elastic": {"minNodes": 1, "maxNodes": 1, "nprocPerNode": 1}}):
            status, answer = dry_run(
                control_plane, test_namespace, with_changes(BASE_JOB, {"spec.instance": name, **beside})
            )
            if status != 201:
                refused.append(f"{name} {beside}: {status} {shown(causes(answer))}")
    assert refused == []


def test_a_mig_job_of_two_workers_is_refused_by_kubectl_with_the_rules_message(
    crds: dict[str, Installed], kubectl: Kubectl, test_namespace: str
) -> None:
    ready(crds, "DGXTrainingJob")
    doc = in_namespace(with_changes(BASE_JOB, {"spec.instance": "dgxa100.80g.mig-1g.10gb.debug",
                                               "spec.elastic.maxNodes": 2}), test_namespace)  # fmt: skip
    proc = kubectl.in_namespace(test_namespace).run("apply", "--dry-run=server", "-f", "-", input=json.dumps(doc),
                                                    check=False)  # fmt: skip
    assert proc.returncode != 0, proc.stdout
    assert (
        'spec.instance: Invalid value: "object": a MIG instance runs one worker with one process on its slice: '
        "leave out spec.resources.gpu"
    ) in proc.stderr, proc.stderr


def test_no_instance_rule_fails_to_evaluate_on_any_name(
    control_plane: ControlPlane, crds: dict[str, Installed], test_namespace: str
) -> None:
    """The apiserver runs the CEL rules even after the instance's pattern failed: on a malformed name
    each rule must hold (the pattern's cause says what is wrong), never add an index or conversion
    error; on a name the pattern takes, the rules answer (a refusal is a rule's message)."""
    ready(crds, "DGXTrainingJob")
    errors = []
    for name in [*ODD_INSTANCES, *MIG_INSTANCES[:3], "dgxa100.80g.8.norm", "dgxh100.80g.1.spot"]:
        for beside in BESIDE_THE_INSTANCE:
            _, answer = dry_run(
                control_plane, test_namespace, with_changes(BASE_JOB, {"spec.instance": name, **beside})
            )
            errors += [
                f"{name} {beside}: {c.field}: {c.message}" for c in causes(answer) if EVALUATION_ERROR in c.message
            ]
    assert errors == [], "\n".join(errors)


# -- the bad manifests ------------------------------------------------------------------------------


def test_tables_name_refused_rows() -> None:
    refused_ids = {r.id for r in REFUSED_ROWS}
    assert set(KNOWN_DIFFERENCES) <= refused_ids, set(KNOWN_DIFFERENCES) - refused_ids
    assert refused_ids >= DECODER_REFUSES, DECODER_REFUSES - refused_ids
    assert len(REFUSED_ROWS) + len(ACCEPTED_ROWS) == len(ROWS)


@pytest.mark.parametrize("row", REFUSED_ROWS, ids=[r.id for r in REFUSED_ROWS])
def test_crd_row_is_refused(row: Row, control_plane: ControlPlane, crds: dict[str, Installed],
                            test_namespace: str) -> None:  # fmt: skip
    doc = manifest(row)
    ready(crds, doc["kind"])
    status, answer = dry_run(control_plane, test_namespace, doc)
    expected = (400, "BadRequest") if row.id in DECODER_REFUSES else (422, "Invalid")
    assert (status, dig(answer, "reason")) == expected, json.dumps(answer, indent=1)
    if status == 422:
        assert (dig(answer, "details", "kind"), dig(answer, "details", "name")) == (
            doc["kind"],
            doc["metadata"]["name"],
        )


@pytest.mark.parametrize("row", REFUSED_ROWS, ids=[r.id for r in REFUSED_ROWS])
def test_crd_row_matches_kubedgx_validate_or_is_a_known_difference(
    row: Row, control_plane: ControlPlane, crds: dict[str, Installed], test_namespace: str
) -> None:
    doc = manifest(row)
    ready(crds, doc["kind"])
    status, answer = dry_run(control_plane, test_namespace, doc)
    assert status >= 400, f"accepted ({status}): test_crd_row_is_refused says more"
    found = causes(answer)
    cli = f"kubedgx validate: {row.path}: ...{row.message}..."
    known = KNOWN_DIFFERENCES.get(row.id)
    if known is None:
        assert identical(row, found), f"the apiserver differs from {cli!r}; it says\n{shown(found)}\n" \
                                      "(fix the CLI, or add the row to KNOWN_DIFFERENCES)"  # fmt: skip
        return
    assert not identical(row, found), f"stale KNOWN_DIFFERENCES[{row.id!r}]: the apiserver now agrees with {cli!r}"
    assert any(c.field == known.field and known.message in c.message for c in found), (
        f"stale KNOWN_DIFFERENCES[{row.id!r}]: no cause {known.field or '<no field>'}: ...{known.message}...; "
        f"the apiserver says\n{shown(found)}"
    )


@pytest.mark.parametrize("row", ACCEPTED_ROWS, ids=[r.id for r in ACCEPTED_ROWS])
def test_catalog_row_is_accepted(row: Row, control_plane: ControlPlane, crds: dict[str, Installed],
                                 test_namespace: str) -> None:  # fmt: skip
    doc = manifest(row)
    ready(crds, doc["kind"])
    status, answer = dry_run(control_plane, test_namespace, doc)
    assert status == 201, json.dumps(answer, indent=1)
    assert dig(answer, "metadata", "name") == doc["metadata"]["name"]


def test_kubectl_apply_shows_each_cause(control_plane: ControlPlane, crds: dict[str, Installed], kubectl: Kubectl,
                                        test_namespace: str) -> None:  # fmt: skip
    """What a user sees: ``kubectl apply`` fails on every crd row and prints every cause of the answer
    (``* FIELD: MESSAGE`` lines, ``<nil>`` for none; a decoder error as its message)."""
    k = kubectl.in_namespace(test_namespace)
    missing = []
    for row in REFUSED_ROWS:
        doc = manifest(row)
        ready(crds, doc["kind"])
        _, answer = dry_run(control_plane, test_namespace, doc)
        proc = k.run("apply", "--dry-run=server", "-f", "-", input=json.dumps(in_namespace(doc, test_namespace)),
                     check=False)  # fmt: skip
        if proc.returncode == 0:
            missing.append(f"{row.id}: kubectl apply succeeded: {proc.stdout.strip()}")
            continue
        for c in causes(answer):
            line = c.message if dig(answer, "details", "causes") is None else f"{c.field or '<nil>'}: {c.message}"
            if line not in proc.stderr:
                missing.append(f"{row.id}: {line!r} not in {proc.stderr!r}")
    assert not missing, "\n".join(missing)


def test_explicit_nulls_are_pruned_and_accepted(control_plane: ControlPlane, crds: dict[str, Installed],
                                                test_namespace: str, catalog: Any) -> None:  # fmt: skip
    """``backoffLimit: null`` and ``nodeSelector: null``: the apiserver drops null fields that are not
    nullable (then defaults them) and accepts the job; so does ``kubedgx validate``, which refused them
    as "must be of type integer, got null" before."""
    from dgx_operator.validation.validator import Validator

    doc = json.loads(json.dumps(BASE_JOB))
    doc["spec"]["backoffLimit"] = None
    doc["spec"]["nodeSelector"] = None
    doc["metadata"]["labels"] = None
    ready(crds, doc["kind"])
    status, answer = dry_run(control_plane, test_namespace, doc)
    assert status == 201, json.dumps(answer, indent=1)
    assert "nodeSelector" not in answer["spec"]
    assert "backoffLimit" not in answer["spec"]  # pruned (the CRD has no defaults: the models default it)
    assert Validator(catalog).validate(doc).ok


def test_a_value_the_crd_no_longer_allows_is_ratcheted_on_update(
    control_plane: ControlPlane, crds: dict[str, Installed], kubectl: Kubectl, test_namespace: str
) -> None:
    """A job stored under an older CRD that allowed negative memory (before issue 12): after the upgrade
    the apiserver still takes updates that leave the value alone (validation ratcheting: the operator's
    finalizer removal, a label), and refuses one that writes another bad value. The operator, for its part,
    reads such a job without raising (tests/integration: InvalidSpec), so its deletion can finish."""
    ready(crds, "DGXTrainingJob")
    path = next(p for p in CRD_FILES if "dgxtrainingjobs" in p.name)
    current = _crd(path)
    loose = json.loads(json.dumps(current))
    memory = loose["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["resources"][
        "properties"
    ]["memory"]
    memory["pattern"] = memory["pattern"].replace(r"^\+?", r"^(\+|-)?", 1)
    memory.pop("minimum", None)
    group_version, plural = RESOURCES["DGXTrainingJob"]
    jobs = f"/apis/{group_version}/namespaces/{test_namespace}/{plural}"
    doc = in_namespace(BASE_JOB, test_namespace)
    doc["metadata"]["name"] = "ratchet"
    doc["spec"]["resources"] = {"memory": "-1Gi"}

    def refuses_negative_memory(expected: bool) -> bool:
        status, _ = control_plane.request("POST", jobs + "?dryRun=All", doc)
        return (status == 422) == expected

    try:
        kubectl.run("apply", "--server-side", "--force-conflicts", f"--field-manager={MANAGER}", "-f", "-",
                    input=json.dumps(loose))  # fmt: skip
        wait_for("the loose schema served", lambda: refuses_negative_memory(False), timeout=60, interval=0.3)
        status, answer = control_plane.request("POST", jobs, doc)
        assert status == 201, answer
    finally:
        kubectl.run("apply", "--server-side", "--force-conflicts", f"--field-manager={MANAGER}", "-f", str(path))
    wait_for("the current schema served", lambda: refuses_negative_memory(True), timeout=60, interval=0.3)

    merge = "application/merge-patch+json"
    status, answer = control_plane.request(
        "PATCH", f"{jobs}/ratchet", {"metadata": {"labels": {"touched": "yes"}}}, content_type=merge
    )
    assert status == 200, answer
    status, answer = control_plane.request(
        "PATCH", f"{jobs}/ratchet", {"spec": {"resources": {"memory": "-2Gi"}}}, content_type=merge
    )
    assert status == 422, answer
    assert any(c.field == "spec.resources.memory" for c in causes(answer)), answer
    status, answer = control_plane.request("DELETE", f"{jobs}/ratchet")
    assert status == 200, answer
