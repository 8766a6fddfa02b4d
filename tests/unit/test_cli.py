"""The `kubedgx` command line: validate, render, crds and instances, called through ``main``
(and once through the installed console script)."""

from __future__ import annotations

import io
import shutil
import subprocess
from collections import Counter
from importlib import resources
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from dgx_operator.cli.main import main
from tests.conftest import BASE_JOB, CRDS, EXAMPLES, ROOT, example_files, load_yaml_docs, with_changes


class Result:
    """Exit code and captured output of one ``main`` call."""

    def __init__(self, code: int, out: str, err: str) -> None:
        self.code = code
        self.out = out
        self.err = err

    def __repr__(self) -> str:
        return f"Result(code={self.code}, out={self.out!r}, err={self.err!r})"


def run(*argv: str, stdin: str = "") -> Result:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err, stdin=io.StringIO(stdin))
    return Result(code, out.getvalue(), err.getvalue())


def write(tmp_path: Path, name: str, docs: list[Any]) -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False), encoding="utf-8")
    return path


def objects(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d is not None]


def jobs_in(path: Path) -> list[dict[str, Any]]:
    return [d for d in load_yaml_docs(path) if d.get("kind") == "DGXTrainingJob"]


EXAMPLE_IDS = [p.name for p in example_files()]

DEPLOYMENT: dict[str, Any] = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "web", "namespace": "ml"},
    "spec": {
        "replicas": 1,
        "selector": {"matchLabels": {"app": "web"}},
        "template": {
            "metadata": {"labels": {"app": "web"}},
            "spec": {"containers": [{"name": "web", "image": "nginx:1.27"}]},
        },
    },
}


# -- validate -------------------------------------------------------------------------------------


def test_examples_exist() -> None:
    names = {p.name for p in example_files()}
    assert {"quickstart.yaml", "mixtral-qlora.yaml", "data-mounts.yaml"} <= names


def test_validate_all_examples_at_once() -> None:
    files = [str(p) for p in example_files()]
    total = sum(len(load_yaml_docs(p)) for p in example_files())

    result = run("validate", *files)

    assert result.code == 0, result
    assert result.out == ""
    assert f"{total} object(s) checked, 0 invalid" in result.err
    # The examples that promise a resumption (spot-preload, mixtral-qlora) checkpoint to an Out mount; the others
    # cannot be restarted in a new pod (elastic.yaml runs its own program: not judged).
    assert "warning:" not in result.err, result.err


def test_validate_quiet_prints_nothing_on_success() -> None:
    result = run("validate", "-q", str(EXAMPLES / "quickstart.yaml"))
    assert (result.code, result.out, result.err) == (0, "", "")


def test_validate_reads_stdin() -> None:
    good = run("validate", "-", stdin=yaml.safe_dump(BASE_JOB))
    assert good.code == 0, good
    assert good.out == ""

    bad_doc = with_changes(BASE_JOB, {"spec.elastic.minNodes": "two"})
    bad = run("validate", "-", stdin=yaml.safe_dump(bad_doc))
    assert bad.code == 1
    assert bad.out.splitlines() == [
        '<stdin>: DGXTrainingJob/job: spec.elastic.minNodes: must be of type integer, got string "two"'
    ]


def test_validate_stdin_with_files(tmp_path: Path) -> None:
    path = write(tmp_path, "other.yaml", [with_changes(BASE_JOB, {"metadata.name": "other"})])
    bad = with_changes(BASE_JOB, {"spec.priority": "urgent"})
    result = run("validate", str(path), "-", stdin=yaml.safe_dump(bad))
    assert result.code == 1
    assert [line.split(": ")[0] for line in result.out.splitlines()] == ["<stdin>"]
    assert "2 object(s) checked, 1 invalid" in result.err


def test_validate_empty_input_is_not_success(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("# nothing here\n---\n", encoding="utf-8")
    result = run("validate", str(path))
    assert result.code == 1
    assert "no objects found" in result.err


def test_yaml_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    lines = [
        "apiVersion: kubedgx.io/v1alpha1",
        "kind: DGXTrainingJob",
        "metadata:",
        "  name: job: oops",  # line 4: a second ': ' in a plain scalar
        "spec: {}",
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")

    result = run("validate", str(path))

    assert result.code == 1
    assert result.out == ""
    err_lines = result.err.splitlines()
    assert len(err_lines) == 1, err_lines
    assert err_lines[0].startswith(f"{path}: line 4: not valid YAML: ")


def test_yaml_syntax_error_on_stdin() -> None:
    result = run("validate", "-", stdin="a: [1, 2\nb: 3\n")
    assert result.code == 1
    assert result.err.startswith("<stdin>: line ")
    assert "not valid YAML" in result.err


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    result = run("validate", str(missing))
    assert result.code == 2  # an I/O error, not an invalid manifest (1)
    assert result.out == ""
    assert result.err.splitlines() == [f"{missing}: cannot read: No such file or directory"]


def test_unreadable_path_is_reported(tmp_path: Path) -> None:
    """A directory cannot be read as a file (chmod 000 would not stop root, which CI may be)."""
    folder = tmp_path / "manifests"
    folder.mkdir()
    good = write(tmp_path, "good.yaml", [BASE_JOB])
    result = run("validate", str(good), str(folder))
    assert result.code == 2
    assert result.out == ""
    assert result.err.splitlines() == [f"{folder}: cannot read: Is a directory"]


def test_io_error_wins_over_yaml_error(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("a: [1\n", encoding="utf-8")
    missing = tmp_path / "nope.yaml"
    result = run("validate", str(broken), str(missing))
    assert result.code == 2
    assert [line.split(": ")[0] for line in result.err.splitlines()] == [str(broken), str(missing)]


def test_render_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    result = run("render", str(missing))
    assert (result.code, result.out) == (2, "")
    assert result.err.startswith(f"{missing}: cannot read: ")


def test_usage_error_exits_2() -> None:
    with pytest.raises(SystemExit) as info:
        run("validate")
    assert info.value.code == 2


def test_builtin_kind_checked_against_kubernetes_schema(tmp_path: Path) -> None:
    good = write(tmp_path, "good.yaml", [DEPLOYMENT])
    assert run("validate", str(good)).code == 0

    bad_doc = with_changes(DEPLOYMENT, {})
    bad_doc["spec"]["template"]["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    bad = write(tmp_path, "bad.yaml", [bad_doc])

    result = run("validate", str(bad))

    assert result.code == 1
    prefix = f"{bad}: Deployment/web: spec.template.spec.containers[0].imagePullPolicyy: "
    assert [line for line in result.out.splitlines() if line.startswith(prefix)], result.out
    assert "unknown field" in result.out


def test_builtin_kind_wrong_type(tmp_path: Path) -> None:
    bad = write(tmp_path, "bad.yaml", [with_changes(DEPLOYMENT, {"spec.replicas": "three"})])
    result = run("validate", str(bad))
    assert result.code == 1
    assert result.out.startswith(f"{bad}: Deployment/web: spec.replicas: ")


def test_builtin_kind_reports_every_problem(tmp_path: Path) -> None:
    doc = with_changes(DEPLOYMENT, {"spec.replicas": "three", "spec.template.spec.hostNetwrok": True})
    path = write(tmp_path, "two.yaml", [doc])
    result = run("validate", str(path))
    assert result.code == 1
    reported = sorted(line.split(": ")[2] for line in result.out.splitlines())
    assert reported == ["spec.replicas", "spec.template.spec.hostNetwrok"]


def test_unknown_kind_is_a_note_not_an_error(tmp_path: Path) -> None:
    other = {"apiVersion": "foo.io/v1", "kind": "Bar", "metadata": {"name": "b"}, "spec": {"anything": [1, 2]}}
    path = write(tmp_path, "bar.yaml", [other])

    result = run("validate", str(path))

    assert result.code == 0, result
    assert result.out == ""
    notes = [line for line in result.err.splitlines() if line.startswith(f"{path}: Bar/b: note: ")]
    assert len(notes) == 1, result.err
    assert "foo.io/v1" in notes[0]


def test_wrong_api_version_of_our_kind(tmp_path: Path) -> None:
    path = write(tmp_path, "v1.yaml", [with_changes(BASE_JOB, {"apiVersion": "kubedgx.io/v1"})])
    result = run("validate", str(path))
    assert result.code == 1
    assert result.out.startswith(f"{path}: DGXTrainingJob/job: apiVersion: ")
    assert "kubedgx.io/v1alpha1" in result.out


def test_unknown_kind_in_our_group(tmp_path: Path) -> None:
    path = write(tmp_path, "k.yaml", [with_changes(BASE_JOB, {"kind": "DGXTrainingJobs"})])
    result = run("validate", str(path))
    assert result.code == 1
    assert result.out.startswith(f"{path}: DGXTrainingJobs/job: kind: ")


def test_output_dir_inside_an_input_mount(tmp_path: Path) -> None:
    """A cross-document rule: only visible when the job and its mount are validated together."""
    mount = {
        "apiVersion": "kubedgx.io/v1alpha1",
        "kind": "DGXDataMount",
        "metadata": {"name": "corpus", "namespace": "ml"},
        "spec": {"source": "s3://bucket/prefix", "direction": "In"},
    }
    job = with_changes(
        BASE_JOB,
        {
            "spec.dataMounts": [{"name": "corpus", "mountPath": "/data"}],
            "spec.trainer.output": {"dir": "/data/out"},
        },
    )
    alone = write(tmp_path, "job.yaml", [job])
    together = write(tmp_path, "both.yaml", [mount, job])
    assert run("validate", str(alone)).code == 0
    result = run("validate", str(together))
    assert result.code == 1
    assert result.out.startswith(f"{together}: DGXTrainingJob/job: spec.trainer.output.dir: ")


def test_a_restartable_job_without_durable_checkpoints_warns_but_is_valid(tmp_path: Path) -> None:
    """The webhook's warning, offline: on stderr as kubectl prints it, exit 0, with -q too (it drops only the
    summary). Judged with the DGXDataMounts given in the same run; a referenced one not given is not guessed at."""
    spot = with_changes(
        BASE_JOB,
        {
            "spec.instance": "dgxa100.80g.8.spot",
            "spec.restartPolicy": "Never",
            "spec.trainer.output": {"dir": "/output/run-1"},
        },
    )
    alone = write(tmp_path, "spot.yaml", [spot])
    result = run("validate", "-q", str(alone))
    assert (result.code, result.out) == (0, ""), result
    assert result.err.splitlines() == [
        f"{alone}: DGXTrainingJob/job: warning: spec.dataMounts: this job can be restarted in a new pod (spot "
        "capacity), but its checkpoints (output.dir /output/run-1) stay in the pod: a replacement starts at step 0. "
        "Add a DGXDataMount with direction: Out and syncCheckpoints: true, mounted at /output/run-1 or a directory "
        "above it"
    ]
    mount = {
        "apiVersion": "kubedgx.io/v1alpha1",
        "kind": "DGXDataMount",
        "metadata": {"name": "ckpt", "namespace": "ml"},
        "spec": {"source": "s3://bucket/ckpt", "direction": "Out", "syncCheckpoints": True},
    }
    durable = with_changes(spot, {"spec.dataMounts": [{"name": "ckpt", "mountPath": "/output"}]})
    jobs, mounts = write(tmp_path, "job.yaml", [durable]), write(tmp_path, "mounts.yaml", [mount])
    assert run("validate", "-q", str(mounts), str(jobs)).err == "", "the mount of another file counts"
    assert run("validate", "-q", str(jobs)).err == "", "a mount not given: nothing said"
    on_the_node = write(tmp_path, "node.yaml", [with_changes(mount, {"spec.syncCheckpoints": False}), durable])
    result = run("validate", str(on_the_node))
    assert result.code == 0
    (warning, summary) = result.err.splitlines()
    assert warning.startswith(f"{on_the_node}: DGXTrainingJob/job: warning: spec.dataMounts[0]: ")
    assert "has syncCheckpoints: false" in warning
    assert summary == "2 object(s) checked, 0 invalid"


# -- render ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("example", example_files(), ids=EXAMPLE_IDS)
def test_render_example_gives_valid_kubernetes_objects(example: Path) -> None:
    result = run("render", str(example))
    assert result.code == 0, result
    rendered = objects(result.out)
    job_names = {j["metadata"]["name"] for j in jobs_in(example)}
    assert job_names, f"{example.name} has no DGXTrainingJob"
    assert rendered
    owners = set()
    for obj in rendered:
        kubernetes_validate.validate(obj, "1.34", strict=True)
        refs = obj["metadata"]["ownerReferences"]
        assert [(r["apiVersion"], r["kind"], r["controller"]) for r in refs] == [
            ("kubedgx.io/v1alpha1", "DGXTrainingJob", True)
        ]
        owners.add(refs[0]["name"])
    assert owners == job_names


@pytest.mark.parametrize("example", example_files(), ids=EXAMPLE_IDS)
def test_render_is_deterministic_and_alias_free(example: Path) -> None:
    first = run("render", str(example))
    second = run("render", str(example))
    assert first.code == 0
    assert first.out == second.out
    assert "&id" not in first.out
    assert "*id" not in first.out


def test_render_of_all_examples_together_is_the_sum_of_each() -> None:
    """Examples are independent: rendering them at once gives the objects of each rendered alone."""
    each = Counter(
        (o["kind"], o["metadata"]["name"]) for p in example_files() for o in objects(run("render", str(p)).out)
    )
    together = run("render", *(str(p) for p in example_files()))
    assert together.code == 0, together
    assert Counter((o["kind"], o["metadata"]["name"]) for o in objects(together.out)) == each


@pytest.mark.parametrize("example", example_files(), ids=EXAMPLE_IDS)
def test_render_namespace_flag(example: Path) -> None:
    result = run("render", "-n", "team-a", str(example))
    assert result.code == 0, result
    rendered = objects(result.out)
    assert rendered
    assert {o["metadata"]["namespace"] for o in rendered} == {"team-a"}


def test_render_default_namespace_is_the_manifests() -> None:
    rendered = objects(run("render", "-", stdin=yaml.safe_dump(BASE_JOB)).out)
    assert rendered
    assert {o["metadata"]["namespace"] for o in rendered} == {BASE_JOB["metadata"]["namespace"]}


def test_render_job_with_missing_data_mount(tmp_path: Path) -> None:
    example = EXAMPLES / "mixtral-qlora.yaml"
    jobs = jobs_in(example)
    assert jobs[0]["spec"]["dataMounts"], "the example must reference a data mount"
    mount_name = jobs[0]["spec"]["dataMounts"][0]["name"]
    path = write(tmp_path, "job-only.yaml", jobs)

    result = run("render", str(path))

    assert result.code == 1
    assert result.out == ""
    prefix = f"{path}: DGXTrainingJob/{jobs[0]['metadata']['name']}: spec.dataMounts[0].name: "
    assert [line for line in result.err.splitlines() if line.startswith(prefix) and mount_name in line], result.err


def test_render_data_mount_in_another_namespace_is_missing(tmp_path: Path) -> None:
    docs = load_yaml_docs(EXAMPLES / "mixtral-qlora.yaml")
    for doc in docs:
        doc["metadata"]["namespace"] = "data" if doc["kind"] == "DGXDataMount" else "ml"
    result = run("render", str(write(tmp_path, "split.yaml", docs)))
    assert result.code == 1
    assert "spec.dataMounts[0].name" in result.err


def test_render_refuses_an_invalid_job(tmp_path: Path) -> None:
    path = write(tmp_path, "bad.yaml", [with_changes(BASE_JOB, {"spec.elastic": {"minNodes": 3, "maxNodes": 2}})])

    result = run("render", str(path))

    assert result.code == 1
    assert result.out == ""
    assert result.err.startswith(f"{path}: DGXTrainingJob/job: spec.elastic.minNodes: ")


def test_render_refuses_a_catalog_violation(tmp_path: Path) -> None:
    path = write(tmp_path, "bad.yaml", [with_changes(BASE_JOB, {"spec.instance": "dgxa100.80g.16.norm"})])
    result = run("render", str(path))
    assert (result.code, result.out) == (1, "")
    assert f"{path}: DGXTrainingJob/job: spec.instance: " in result.err


def test_render_without_a_job(tmp_path: Path) -> None:
    mount = load_yaml_docs(EXAMPLES / "mixtral-qlora.yaml")[0]
    assert mount["kind"] == "DGXDataMount"
    result = run("render", str(write(tmp_path, "mount.yaml", [mount])))
    assert (result.code, result.out) == (1, "")
    assert "no DGXTrainingJob" in result.err


def _env(obj: dict[str, Any], name: str) -> list[str]:
    spec = obj.get("spec", {})
    containers = [*spec.get("initContainers", []), *spec.get("containers", [])]
    return [e.get("value") for c in containers for e in c.get("env", []) if e["name"] == name]


def test_render_uid_flag() -> None:
    uid = "0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9"
    example = str(EXAMPLES / "elastic.yaml")

    with_uid = objects(run("render", "--uid", uid, example).out)
    without = objects(run("render", example).out)

    assert with_uid
    for obj in with_uid:
        assert [r["uid"] for r in obj["metadata"]["ownerReferences"]] == [uid]
    pods = [o for o in with_uid if o["kind"] == "Pod"]
    assert pods
    for pod in pods:
        assert _env(pod, "PET_RDZV_ID") == [uid]
    assert uid not in yaml.safe_dump_all(without)
    assert all(_env(p, "PET_RDZV_ID") != [uid] for p in without if p["kind"] == "Pod")


def test_render_uid_in_manifest_is_used(tmp_path: Path) -> None:
    uid = "11111111-2222-4333-8444-555555555555"
    path = write(tmp_path, "job.yaml", [with_changes(BASE_JOB, {"metadata.uid": uid})])
    rendered = objects(run("render", str(path)).out)
    assert rendered
    assert {r["uid"] for o in rendered for r in o["metadata"]["ownerReferences"]} == {uid}


# -- crds and instances --------------------------------------------------------------------------------


def test_crds_command_prints_the_crd_files() -> None:
    result = run("crds")
    assert result.code == 0
    on_disk = [doc for path in sorted(CRDS.glob("*.yaml")) for doc in load_yaml_docs(path)]
    assert len(on_disk) == 4
    printed = objects(result.out)

    def key(doc: dict[str, Any]) -> str:  # files sort by name; the command prints in KINDS order
        return str(doc["metadata"]["name"])

    assert sorted(printed, key=key) == sorted(on_disk, key=key)
    assert {d["spec"]["names"]["kind"] for d in printed} == {"DGXTrainingJob", "DGXDataMount", "DGXLimits", "DGXBudget"}


def test_instances_lists_spot_instance() -> None:
    result = run("instances")
    assert result.code == 0
    rows = [line.split() for line in result.out.splitlines()]
    assert rows[0][:3] == ["INSTANCE", "GPU", "GPUS"]
    by_name = {r[0]: r for r in rows[1:]}
    spot = by_name["dgxh100.80g.8.spot"]
    assert spot[2] == "8"  # GPUs, the name's third part
    assert spot[3] == "80GiB"  # GPU memory, the name's second part
    assert by_name["dgxa100.40g.1.norm"][2] == "1"
    assert "dgxgb200.186g.4.norm" in by_name


def test_instances_shows_prices_per_gpu_and_per_worker_and_says_they_are_examples(tmp_path: Path) -> None:
    result = run("instances")
    rows = [line.split() for line in result.out.splitlines()]
    assert rows[0][-2:] == ["USD/GPU-H", "USD/WORKER-H"]
    by_name = {r[0]: r for r in rows[1:]}
    assert by_name["dgxh100.80g.8.norm"][-2:] == ["3.00", "24.00"]
    assert by_name["dgxh100.80g.4.spot"][-2:] == ["1.20", "4.80"]
    assert "the prices are the catalog's examples, not this cluster's" in result.err
    assert "examples" not in result.out  # the table stays a table

    data = yaml.safe_load(resources.files("dgx_operator").joinpath("catalog.yaml").read_text(encoding="utf-8"))
    data["pricing"]["examples"] = False
    data["pricing"]["currency"] = "EUR"
    data["pricing"]["perGpuHour"]["h100.80g"].pop("spot")
    path = tmp_path / "catalog.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    result = run("instances", "--catalog", str(path))
    rows = [line.split() for line in result.out.splitlines()]
    assert rows[0][-2:] == ["EUR/GPU-H", "EUR/WORKER-H"]
    by_name = {r[0]: r for r in rows[1:]}
    assert by_name["dgxh100.80g.8.spot"][-2:] == ["-", "-"]  # left unpriced: no price, never 0
    assert result.err == ""


def test_instances_with_a_custom_catalog(tmp_path: Path) -> None:
    catalog = {
        "capacities": {"norm": {}},
        "gpus": [
            {
                "family": "x9",
                "memoryGiB": 7,
                "products": ["X9"],
                "shapes": [3],
                "perGpu": {"cpu": 2, "memoryGi": 4, "shmGi": 1},
            }
        ],
    }
    path = tmp_path / "catalog.yaml"
    path.write_text(yaml.safe_dump(catalog), encoding="utf-8")
    result = run("instances", "--catalog", str(path))
    assert result.code == 0
    assert [line.split()[0] for line in result.out.splitlines()[1:]] == ["dgxx9.7g.3.norm"]


def test_bad_catalog_is_a_usage_error(tmp_path: Path) -> None:
    path = tmp_path / "catalog.yaml"
    path.write_text("gpus: []\n", encoding="utf-8")
    result = run("validate", "--catalog", str(path), str(EXAMPLES / "quickstart.yaml"))
    assert result.code == 2
    assert result.out == ""
    assert "invalid instance catalog" in result.err


# -- the installed console script ------------------------------------------------------------------------


def test_console_script_is_installed() -> None:
    exe = shutil.which("kubedgx")
    assert exe is not None, "the kubedgx console script is not on PATH: is the project installed (pip install -e .)?"
    proc = subprocess.run(
        [exe, "validate", "examples/quickstart.yaml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "1 object(s) checked, 0 invalid" in proc.stderr
