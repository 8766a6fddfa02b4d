"""Task config -> manifest, for every example in examples/flyte/workflows.py (golden files), and the
configs kubedgx refuses, each with the line ``kubedgx validate`` prints for the same manifest.

Regenerate the golden files after an intended change: KUBEDGX_UPDATE_GOLDEN=1 pytest tests/flyte.
"""

from __future__ import annotations

import datetime
import io
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from flytekit import Resources, task
from flytekit.core.base_task import TaskMetadata

from dgx_operator.catalog import Catalog
from dgx_operator.cli import main as cli
from dgx_operator.validation.durability import reference_warnings
from flytekitplugins.dgx import DGXConfig, DGXConfigError, DGXDataConfig, DGXQLoRATask, DGXTorchElastic
from flytekitplugins.dgx.config import from_custom, to_custom
from flytekitplugins.dgx.manifest import (
    KEY_LABEL,
    Execution,
    Options,
    Plan,
    SettingError,
    build,
    digest,
    job_name,
    options_from_env,
)
from tests.flyte.flyte import metadata, template, workflows

GOLDEN = Path(__file__).parent / "golden"
PREFIX = "s3://flyte-bucket/metadata/run/n0/0"
EXAMPLES = ("train_large_model", "process_with_dgx", "fine_tune_mixtral", "distributed_train", "cost_effective_train",
            "debug_training", "qlora_legal", "square")  # fmt: skip
#: The ImageSpec tag is a hash of flytekit's own ImageSpec fields: stable here, not across flytekit releases.
IMAGE_TAG = re.compile(r"(ghcr\.io/kubedgx/kubedgx-flyte):[A-Za-z0-9_-]+")


def documents(plan: Plan) -> str:
    text = yaml.safe_dump_all([*plan.mounts, plan.job], sort_keys=False, width=120)
    return IMAGE_TAG.sub(r"\1:<imagespec-tag>", text)


@pytest.mark.parametrize("name", EXAMPLES)
def test_each_example_builds_the_manifest_in_its_golden_file(name: str) -> None:
    plan = build(template(getattr(workflows(), name), PREFIX), PREFIX, metadata(service_account="flyte-ml"))
    text = documents(plan)
    golden = GOLDEN / f"{name}.yaml"
    if os.environ.get("KUBEDGX_UPDATE_GOLDEN"):
        golden.write_text(text, encoding="utf-8")
    assert golden.is_file(), f"no golden file {golden}: run with KUBEDGX_UPDATE_GOLDEN=1"
    assert text == golden.read_text(encoding="utf-8")


@pytest.mark.parametrize("name", EXAMPLES)
def test_each_example_manifest_passes_kubedgx_validate(name: str, tmp_path: Path) -> None:
    """The same documents through the kubedgx CLI: what the connector sends, a cluster accepts."""
    plan = build(template(getattr(workflows(), name), PREFIX), PREFIX, metadata())
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump_all([*plan.mounts, plan.job]), encoding="utf-8")
    out, err = io.StringIO(), io.StringIO()
    assert cli.main(["validate", str(path)], out=out, err=err) == 0, out.getvalue() + err.getvalue()


def test_the_mapping_of_each_field() -> None:
    """What the golden files hold, said field by field (so a wrong golden file cannot hide it)."""
    w = workflows()
    job = build(template(w.fine_tune_mixtral, PREFIX), PREFIX, metadata(service_account="flyte-ml")).job
    spec = job["spec"]
    assert spec["resources"] == {"gpu": 8, "cpu": "32", "memory": "512Gi"}
    assert spec["serviceAccountName"] == "flyte-ml"
    assert spec["command"][0] == "pyflyte-execute"
    assert f"{PREFIX}/inputs.pb" in spec["command"]
    assert spec["command"][-4:] == ["task-module", "workflows", "task-name", "fine_tune_mixtral"]
    env = {e["name"]: e["value"] for e in spec["env"]}
    assert env["FLYTE_INTERNAL_EXECUTION_ID"] == "f3a9c2b1e0d4"
    assert env["FLYTE_INTERNAL_EXECUTION_PROJECT"] == "ml"
    assert job["metadata"]["namespace"] == "ml-development"
    assert job["metadata"]["labels"]["execution-id"] == "f3a9c2b1e0d4"
    # No DGXTorchElastic: no in-place restarts (a raised exception fails the attempt once).
    assert spec["elastic"] == {"maxRestarts": 0}

    elastic = build(template(w.distributed_train, PREFIX), PREFIX, metadata()).job["spec"]
    assert elastic["elastic"] == {"minNodes": 4, "maxNodes": 8, "nprocPerNode": 8, "maxRestarts": 3}
    debug = build(template(w.debug_training, PREFIX), PREFIX, metadata()).job["spec"]
    assert debug["debug"] == {"enabled": True, "interactive": True}
    assert debug["instance"] == "dgxa100.80g.8.debug"
    spot = build(template(w.cost_effective_train, PREFIX), PREFIX, metadata()).job["spec"]
    assert (spot["instance"], spot["maxDuration"], spot["dataCache"]) == ("dgxa100.80g.8.spot", "6h", "preload")

    data = build(template(w.process_with_dgx, PREFIX), PREFIX, metadata())
    (src_in, src_out) = data.mounts
    assert (src_in["spec"], src_out["spec"]) == (
        {"source": "s3://my-bucket/input", "direction": "In"},
        {"source": "gs://my-bucket/output", "direction": "Out"},
    )
    refs = data.job["spec"]["dataMounts"]
    assert refs == [
        {"name": src_in["metadata"]["name"], "mountPath": "/mnt/dgx/inputs/0"},
        {"name": src_out["metadata"]["name"], "mountPath": "/mnt/dgx/outputs/0"},
    ]
    env = {e["name"]: e["value"] for e in data.job["spec"]["env"]}
    assert (env["DGX_INPUT_DIRS"], env["DGX_OUTPUT_DIRS"]) == ("/mnt/dgx/inputs/0", "/mnt/dgx/outputs/0")

    qlora = build(template(w.qlora_legal), PREFIX, metadata()).job["spec"]
    assert "command" not in qlora, "the operator's trainer command"
    assert "image" not in qlora, "the operator's trainer image"
    assert qlora["trainer"]["lora"] == {"r": 16, "alpha": 32}
    assert qlora["trainer"]["training"]["epochs"] == 1


def test_the_task_timeout_becomes_max_duration_unless_max_duration_is_set() -> None:
    @task(task_config=DGXConfig(instance="dgxh100.80g.8.norm"), timeout=datetime.timedelta(hours=2))
    def timed() -> None: ...

    @task(task_config=DGXConfig(instance="dgxh100.80g.8.norm", max_duration="3h"), timeout=datetime.timedelta(hours=2))
    def both() -> None: ...

    assert build(template(timed), PREFIX, metadata()).job["spec"]["maxDuration"] == "7200s"
    assert build(template(both), PREFIX, metadata()).job["spec"]["maxDuration"] == "3h"


def test_the_job_name_comes_from_the_execution_so_a_repeated_create_finds_the_same_job() -> None:
    square = workflows().square
    first = build(template(square), PREFIX, metadata())
    again = build(template(square), PREFIX, metadata())
    retry = build(template(square), PREFIX, metadata(retry=1))
    other_node = build(template(square), PREFIX, metadata(node="n1"))
    assert first.name == again.name
    assert first.job["metadata"]["labels"][KEY_LABEL] == digest(first.key, 32)
    assert len({first.name, retry.name, other_node.name}) == 3, "a Flyte retry or another node is a job of its own"
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", first.name)
    assert len(first.name) <= 50
    long = job_name("x" * 500, "An Execution Name That Is Far Too Long For A Kubernetes Name 123")
    assert len(long) <= 50, long
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", long), long
    local = build(template(square, "/tmp/flyte-x/raw/abc"), "/tmp/flyte-x/raw/abc")
    local2 = build(template(square, "/tmp/flyte-x/raw/def"), "/tmp/flyte-x/raw/def")
    assert local.name != local2.name, "local runs: one job per output prefix"
    assert local.namespace == "default"


def test_the_namespace_is_the_config_s_then_the_connector_s_then_the_execution_s() -> None:
    square = workflows().square
    assert build(template(square), PREFIX, metadata(namespace="proj-dev")).namespace == "proj-dev"
    assert build(template(square), PREFIX, metadata(namespace="proj-dev"), Options(namespace="dgx")).namespace == "dgx"

    @task(task_config=DGXConfig(instance="dgxh100.80g.8.norm", namespace="team-a"))
    def pinned() -> None: ...

    assert build(template(pinned), PREFIX, metadata(), Options(namespace="dgx")).namespace == "team-a"


def test_the_connector_s_job_ttl_goes_on_every_job_it_creates() -> None:
    wf = workflows()
    options = options_from_env({"KUBEDGX_FLYTE_JOB_TTL": " 86400 "})
    assert options.job_ttl == 86400
    for t in (wf.square, wf.qlora_legal):
        plan = build(template(t, PREFIX), PREFIX, metadata(), options)  # through kubedgx's Validator too
        assert plan.job["spec"]["ttlSecondsAfterFinished"] == 86400, t.name
    for unset in ({}, {"KUBEDGX_FLYTE_JOB_TTL": ""}):
        options = options_from_env(unset)
        assert options.job_ttl is None
        assert "ttlSecondsAfterFinished" not in build(template(wf.square), PREFIX, metadata(), options).job["spec"]


@pytest.mark.parametrize("value", ["1h", "-100", "86400.5", "59", "0", "²", "1e6", "9999999999"])
def test_a_bad_job_ttl_is_refused_naming_the_variable_and_the_fix(value: str) -> None:
    with pytest.raises(SettingError) as refused:
        options_from_env({"KUBEDGX_FLYTE_JOB_TTL": value})
    message = str(refused.value)
    assert message.startswith(f"KUBEDGX_FLYTE_JOB_TTL={value!r}: must be a whole number of seconds, at least 60")
    assert "unset it to keep them" in message


def test_data_mounts_are_shared_by_tasks_that_read_the_same_prefix() -> None:
    @task(task_config=DGXDataConfig(instance="dgxh100.80g.8.norm", input_mounts=["s3://my-bucket/input"]))
    def one() -> None: ...

    @task(task_config=DGXDataConfig(instance="dgxh100.80g.8.norm", input_mounts=["s3://my-bucket/input"],
                                    credentials_secret="s3-creds"))  # fmt: skip
    def with_secret() -> None: ...

    shared = build(template(workflows().process_with_dgx), PREFIX, metadata()).mounts[0]["metadata"]["name"]
    assert build(template(one), PREFIX, metadata()).mounts[0]["metadata"]["name"] == shared
    other = build(template(with_secret), PREFIX, metadata()).mounts[0]
    assert other["metadata"]["name"] != shared, "another secret reads differently: a mount of its own"
    assert other["spec"]["credentialsSecretRef"] == {"name": "s3-creds"}


def test_the_config_survives_the_template_s_protobuf_struct() -> None:
    """custom travels as a protobuf Struct, which turns every number into a double."""
    from google.protobuf import json_format, struct_pb2

    config = DGXConfig(instance="dgxh100.80g.8.norm", elastic=DGXTorchElastic(min_nodes=2, max_nodes=4),
                       data=DGXDataConfig(input_mounts=["s3://b/p"]))  # fmt: skip
    struct = struct_pb2.Struct()
    struct.update(to_custom(config))
    back = from_custom(json_format.MessageToDict(struct), "t")
    assert back.placement == config
    assert back.elastic is not None
    assert back.elastic.min_nodes == 2
    assert isinstance(back.elastic.min_nodes, int)


# -- refused ---------------------------------------------------------------------------------


def refusal(t: Any) -> list[str]:
    with pytest.raises(DGXConfigError) as info:
        build(template(t), PREFIX, metadata())
    return list(info.value.lines)


def validate_lines(plan_objects: list[dict[str, Any]], tmp_path: Path) -> list[str]:
    """What ``kubedgx validate`` prints for these objects: ``<file>: <kind>/<name>: <problem>``."""
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump_all(plan_objects), encoding="utf-8")
    out = io.StringIO()
    cli.main(["validate", str(path)], out=out, err=io.StringIO())
    return [line.split(": ", 1)[1] for line in out.getvalue().splitlines()]


def test_the_issue_s_spot_example_as_written_is_refused_with_kubedgx_validate_s_line(tmp_path: Path) -> None:
    """data_cache preload without a mount to preload: the example in examples/ adds one."""

    @task(task_config=DGXConfig(instance="dgxa100.80g.8.spot", max_duration="6h", data_cache="preload"))
    def cost_effective_train() -> None: ...

    lines = refusal(cost_effective_train)
    assert len(lines) == 1, lines
    assert "spec.dataCache" in lines[0], lines
    assert "spec.dataMounts" in lines[0], lines
    # The same line as kubedgx validate's for the manifest the connector would have sent: the
    # valid example's job without its mount.
    job = build(template(workflows().cost_effective_train), PREFIX, metadata()).job
    del job["spec"]["dataMounts"]
    assert validate_lines([job], tmp_path) == lines


@pytest.mark.parametrize(
    ("config", "kwargs", "expected"),
    [
        (
            DGXConfig(instance="dgxa100.80g.8"),
            {},
            'spec.instance: invalid value "dgxa100.80g.8": must look like dgx<gpu>.<memory>g.<gpus>.<capacity>',
        ),
        (DGXConfig(instance="dgxz900.80g.8.norm"), {}, "spec.instance"),
        (
            DGXConfig(instance="dgxa100.80g.8.norm", max_duration="1 day"),
            {},
            'spec.maxDuration: invalid value "1 day": must be a Go duration',
        ),
        (DGXConfig(instance="dgxa100.80g.8.norm", priority="urgent"), {}, "spec.priority"),  # type: ignore[arg-type]
        (DGXTorchElastic(instance="dgxa100.80g.8.norm", min_nodes=4, max_nodes=2), {}, "spec.elastic.minNodes"),
        (DGXTorchElastic(instance="dgxa100.80g.8.norm", nproc_per_node=16), {}, "spec.elastic"),
        (DGXConfig(instance="dgxa100.80g.8.norm"), {"requests": Resources(gpu="16")}, "spec.resources"),
        (DGXConfig(instance="dgxa100.80g.8.norm", interactive=True, elastic=DGXTorchElastic(min_nodes=2)), {}, "spec"),
        (DGXDataConfig(instance="dgxa100.80g.8.norm", input_mounts=["ftp://host/data"]), {}, "spec.source"),
        (
            DGXConfig(instance="dgxa100.80g.8.norm"),
            {"environment": {"MASTER_ADDR": "x"}},
            "environment.MASTER_ADDR: is reserved",
        ),
        (
            DGXConfig(instance="dgxa100.80g.8.norm"),
            {"environment": {"PET_NNODES": "4"}},
            "environment.PET_NNODES: is reserved",
        ),
    ],
)
def test_bad_configs_are_refused_naming_the_field(config: Any, kwargs: dict[str, Any], expected: str) -> None:
    def body() -> None: ...

    t = task(task_config=config, **kwargs)(body)
    lines = refusal(t)
    assert any(expected in line for line in lines), lines
    assert all(": " in line for line in lines)


def test_python_types_the_api_cannot_see_are_refused_when_the_task_is_defined() -> None:
    def body() -> None: ...

    with pytest.raises(DGXConfigError, match=r"DGXDataConfig.input_mounts: must be a list"):
        task(task_config=DGXDataConfig(input_mounts="s3://my-bucket/input"))(body)  # type: ignore[arg-type]
    with pytest.raises(DGXConfigError, match=r"DGXTorchElastic.min_nodes: must be an integer"):
        task(task_config=DGXTorchElastic(min_nodes="4"))(body)  # type: ignore[arg-type]
    with pytest.raises(DGXConfigError, match=r"pod_template: a DGX task's pods are the operator's"):
        task(task_config=DGXConfig(), pod_template_name="gpu-pods")(body)


def test_the_qlora_task_refuses_a_bad_trainer_section_and_needs_an_output_mount() -> None:
    with pytest.raises(DGXConfigError, match=r"trainer\.lora\.r"):
        DGXQLoRATask(name="bad", trainer={"model": {"name": "m"}, "dataset": {"path": "/d.jsonl"}, "lora": {"r": 0}})
    no_out = DGXQLoRATask(name="no_out", trainer={"model": {"name": "m"}, "dataset": {"path": "/d.jsonl"}},
                          task_config=DGXConfig(instance="dgxh100.80g.8.norm"))  # fmt: skip
    lines = refusal(no_out)
    assert any(line.startswith("DGXDataConfig.output_mounts: the QLoRA task returns the URI") for line in lines)


# -- interruptible: spot capacity -------------------------------------------------------------------------------


def instance_of(t: Any, meta: Any = None, options: Options | None = None) -> str:
    spec = build(template(t), PREFIX, meta if meta is not None else metadata(), options).job["spec"]
    return str(spec["instance"])


def test_an_interruptible_task_that_names_no_instance_runs_on_the_spot_variant_of_the_default() -> None:
    """Flyte's interruptible=True: the task may be preempted, so it gets the cheap pool; the same GPUs and shape
    as the connector's default instance, on spot."""

    @task(task_config=DGXConfig(max_duration="6h"), interruptible=True)
    def preemptible() -> None: ...

    @task(task_config=DGXTorchElastic(min_nodes=2, max_nodes=4), interruptible=True)
    def elastic() -> None: ...

    assert instance_of(preemptible) == "dgxa100.80g.8.spot"
    assert instance_of(elastic) == "dgxa100.80g.8.spot"
    assert instance_of(preemptible, options=Options(default_instance="dgxh100.80g.4.norm")) == "dgxh100.80g.4.spot"
    assert instance_of(preemptible, options=Options(default_instance="dgxh100.80g.8.spot")) == "dgxh100.80g.8.spot"


@pytest.mark.parametrize("interruptible", [True, False, None], ids=["interruptible", "not", "unset"])
def test_a_task_that_names_a_spot_instance_keeps_it(interruptible: bool | None) -> None:
    @task(task_config=DGXConfig(instance="dgxh100.80g.8.spot"), interruptible=interruptible)
    def on_spot() -> None: ...

    assert instance_of(on_spot) == "dgxh100.80g.8.spot"


@pytest.mark.parametrize("interruptible", [False, None], ids=["not", "unset"])
def test_without_interruptible_the_instance_is_as_before(interruptible: bool | None) -> None:
    @task(task_config=DGXConfig(), interruptible=interruptible)
    def default() -> None: ...

    @task(task_config=DGXConfig(instance="dgxh100.80g.8.norm"), interruptible=interruptible)
    def named() -> None: ...

    assert instance_of(default) == "dgxa100.80g.8.norm"
    assert instance_of(named) == "dgxh100.80g.8.norm"


@pytest.mark.parametrize(("named", "capacity"), [("dgxa100.80g.8.norm", "norm"), ("dgxa100.80g.1.debug", "debug")])
def test_interruptible_with_an_instance_of_another_pool_is_refused_naming_both_fixes(named: str, capacity: str) -> None:
    """Which of the two the user meant cannot be told: nothing is created, and the line says how to have either."""

    @task(task_config=DGXConfig(instance=named), interruptible=True)
    def contradicts() -> None: ...

    spot = named.rsplit(".", 1)[0] + ".spot"
    assert refusal(contradicts) == [
        f"DGXConfig.instance: {named!r} is {capacity} capacity, but interruptible=True (the task's metadata) asks for "
        f"spot: name {spot!r} to run on spot, or drop interruptible (interruptible=False) to run on {capacity}"
    ]


def test_a_catalog_without_a_spot_pool_refuses_an_interruptible_task_that_names_no_instance(tmp_path: Path) -> None:
    catalog = {
        "capacities": {"norm": {}},
        "gpus": [
            {
                "family": "a100",
                "memoryGiB": 80,
                "products": ["NVIDIA-A100-SXM4-80GB"],
                "shapes": [8],
                "perGpu": {"cpu": 28, "memoryGi": 220, "shmGi": 16},
            }
        ],
    }

    @task(task_config=DGXConfig(), interruptible=True)
    def preemptible() -> None: ...

    with pytest.raises(DGXConfigError) as info:
        build(template(preemptible), PREFIX, metadata(), Options(catalog=Catalog.from_mapping(catalog)))
    assert list(info.value.lines) == [
        "DGXConfig.instance: interruptible=True (the task's metadata) asks for the spot variant of the connector's "
        "default instance dgxa100.80g.8.norm, but this cluster's catalog has no dgxa100.80g.8.spot (capacity pools: "
        "norm): name an instance in the task config, or drop interruptible"
    ]


def test_flyte_s_interruptible_for_the_attempt_wins_when_it_is_sent() -> None:
    """Propeller resolves the task's value with a workflow's or node's and the interruptible failure threshold.
    flytekit 1.x's TaskExecutionMetadata drops it (what the connector gets today); where a metadata object does
    carry it, it decides."""
    assert Execution.from_metadata(metadata()).interruptible is None

    @task(task_config=DGXConfig(), interruptible=True)
    def preemptible() -> None: ...

    @task(task_config=DGXConfig())
    def plain() -> None: ...

    last_attempts = metadata(retry=2)
    last_attempts.interruptible = False  # type: ignore[attr-defined]  # a flytekit that keeps admin's field
    assert instance_of(preemptible, last_attempts) == "dgxa100.80g.8.norm"
    overridden = metadata()
    overridden.interruptible = True  # type: ignore[attr-defined]
    assert instance_of(plain, overridden) == "dgxa100.80g.8.spot"


def test_propeller_s_interruptible_label_decides_the_pool() -> None:
    """Propeller v1.16.8 sends its resolution for the attempt only as the label ``interruptible`` ("true" or
    "false"; TaskExecutionMetadata's own field stays unset): a workflow's or node's override, or the fall back to
    non-interruptible after too many system failures, reaches the connector that way."""

    @task(task_config=DGXConfig(), interruptible=True)
    def preemptible() -> None: ...

    @task(task_config=DGXConfig())
    def plain() -> None: ...

    said_true, said_false = metadata(labels={"interruptible": "true"}), metadata(labels={"interruptible": "false"})
    assert (Execution.from_metadata(said_true).interruptible, Execution.from_metadata(said_false).interruptible) == (
        True,
        False,
    )
    assert instance_of(plain, said_true) == "dgxa100.80g.8.spot"
    assert instance_of(preemptible, said_false) == "dgxa100.80g.8.norm"
    assert instance_of(preemptible, said_true) == "dgxa100.80g.8.spot"
    # Without the label the task's own value stands, as before.
    assert instance_of(preemptible, metadata()) == "dgxa100.80g.8.spot"
    assert instance_of(plain, metadata()) == "dgxa100.80g.8.norm"
    # The label wins over a field a future flytekit might carry unset (False) while propeller leaves it so.
    unset_field = metadata(labels={"interruptible": "true"})
    unset_field.interruptible = False  # type: ignore[attr-defined]
    assert instance_of(plain, unset_field) == "dgxa100.80g.8.spot"
    # The job keeps the label, as it keeps the execution's other labels.
    job = build(template(plain), PREFIX, said_true).job
    assert job["metadata"]["labels"]["interruptible"] == "true"


def test_the_qlora_task_is_interruptible_too_and_writes_into_its_output_mount(catalog: Catalog) -> None:
    """On spot a reclaimed worker resumes from the checkpoints its output mount uploaded: output.dir defaults to
    that mount (the trainer's own default, /workspace/output, is in no mount: no checkpoint was uploaded and no
    adapter archived). So the manifest draws no checkpoint warning from kubedgx validate."""
    w = workflows()
    legal = build(template(w.qlora_legal), PREFIX, metadata())
    assert legal.job["spec"]["trainer"]["output"] == {"dir": "/mnt/dgx/outputs/0"}
    section = {"model": {"name": "m"}, "dataset": {"path": "/mnt/dgx/inputs/0/d.jsonl"}}
    data = DGXDataConfig(input_mounts=["s3://bucket/in"], output_mounts=["s3://bucket/out", "s3://bucket/more"])
    spot = DGXQLoRATask(name="spot", trainer=section, task_config=data, metadata=TaskMetadata(interruptible=True))
    plan = build(template(spot), PREFIX, metadata())
    assert plan.job["spec"]["instance"] == "dgxa100.80g.8.spot"
    assert plan.job["spec"]["trainer"]["output"] == {"dir": "/mnt/dgx/outputs/0"}
    assert reference_warnings(catalog, [(obj, i) for i, obj in enumerate([*plan.mounts, plan.job])]) == []

    second = DGXQLoRATask(name="second", trainer={**section, "output": {"dir": "/mnt/dgx/outputs/1/run"}},
                          task_config=data)  # fmt: skip
    assert (
        build(template(second), PREFIX, metadata()).job["spec"]["trainer"]["output"]["dir"] == "/mnt/dgx/outputs/1/run"
    )
    elsewhere = DGXQLoRATask(name="elsewhere", trainer={**section, "output": {"dir": "/workspace/output"}},
                             task_config=data)  # fmt: skip
    assert refusal(elsewhere) == [
        "trainer.output.dir: '/workspace/output' is outside the task's output mounts (/mnt/dgx/outputs/0, "
        "/mnt/dgx/outputs/1), the only place its checkpoints are uploaded from and its adapter is archived from: "
        "leave output.dir out (it is then /mnt/dgx/outputs/0) or set it inside one of them"
    ]
