"""The data plane of a worker pod (build/datasync.py and its use in build/pod.py): pull init containers,
checkpoint restores, the native uploader sidecar, their credentials and arguments, per-run paths."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from dgx_operator.api import DGXDataMountSpec, DGXTrainingJob
from dgx_operator.api.trainingjob import DataMountRef
from dgx_operator.render import Defaults, JobIdentity
from dgx_operator.render.datasync import (
    MountPlan,
    archive_uri,
    archives,
    checkpoint_uri,
    credentials,
    filter_args,
    logs_uri,
    out_local_dir,
    run_dir,
    store_args,
    syncs_checkpoints,
    watched_dir,
)
from dgx_operator.render.resolved import DEFAULT_TRAINER_IMAGE
from tests.unit.render_helpers import (
    COMMAND_MODE,
    OUT,
    UID,
    assert_valid,
    children,
    inits,
    job_obj,
    mount_specs,
    one_pod,
    pods_of,
    refs,
    sync_inits,
    the_container,
    volume_at,
)

RUN = "job-5f0c2a4e"  # the job's name and the first 8 hex digits of UID
IDENT = JobIdentity("job", "ml", UID)
DATASYNC = ["python", "-m", "dgx_datasync"]
COMMON = ["--workers", "8", "--log-format", "json"]
SYNC_RESOURCES = {"requests": {"cpu": "4", "memory": "4Gi"}, "limits": {"cpu": "4", "memory": "4Gi"}}
SIDECAR_RESOURCES = {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}
UNBUFFERED = {"name": "PYTHONUNBUFFERED", "value": "1"}
#: Trainer output inside an Out mount at /out.
OUT_RUN = {"spec.trainer.output": {"dir": "/out/run"}}
S3_SECRET_ENV = [
    {"name": "AWS_ACCESS_KEY_ID", "valueFrom": {"secretKeyRef": {"name": "s3-creds", "key": "AWS_ACCESS_KEY_ID"}}},
    {
        "name": "AWS_SECRET_ACCESS_KEY",
        "valueFrom": {"secretKeyRef": {"name": "s3-creds", "key": "AWS_SECRET_ACCESS_KEY"}},
    },
    {
        "name": "AWS_SESSION_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "s3-creds", "key": "AWS_SESSION_TOKEN", "optional": True}},
    },
]


# --- helpers -------------------------------------------------------------------------------------


def pod_of(changes: Mapping[str, Any] | None = None, **kwargs: Any) -> dict[str, Any]:
    return pods_of(children(changes, **kwargs))[0]


def plan_for(mount_path: str, spec: Mapping[str, Any] | None = None, index: int = 0) -> MountPlan:
    mount = DGXDataMountSpec.model_validate({"source": "s3://bucket/out", "direction": "Out", **(spec or {})})
    return MountPlan(index, DataMountRef(name="ckpt", mount_path=mount_path), mount, f"data-{index}")


def job_spec(changes: Mapping[str, Any] | None = None) -> Any:
    return DGXTrainingJob.model_validate(job_obj(changes)).spec


# --- names and remote layout ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "uid", "expected"),
    [
        ("job", UID, RUN),
        ("llama-ft", "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d", "llama-ft-0a1b2c3d"),
        # Dashes are dropped before taking 8 characters, wherever they are.
        ("x", "12-34-56-78-9a", "x-12345678"),
    ],
)
def test_run_dir(name: str, uid: str, expected: str) -> None:
    assert run_dir(JobIdentity(name, "ml", uid)) == expected


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("s3://bucket/out", f"s3://bucket/out/{RUN}/checkpoints"),
        ("s3://bucket/out/", f"s3://bucket/out/{RUN}/checkpoints"),
        ("s3://bucket", f"s3://bucket/{RUN}/checkpoints"),
        ("gs://bucket/a/b", f"gs://bucket/a/b/{RUN}/checkpoints"),
    ],
)
def test_checkpoint_uri(source: str, expected: str) -> None:
    spec = DGXDataMountSpec.model_validate({"source": source, "direction": "Out"})
    assert checkpoint_uri(IDENT, spec) == expected


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("s3://bucket/out", f"s3://bucket/out/{RUN}/logs"),
        ("s3://bucket/out/", f"s3://bucket/out/{RUN}/logs"),
        ("s3://bucket", f"s3://bucket/{RUN}/logs"),
        ("gs://bucket/a/b", f"gs://bucket/a/b/{RUN}/logs"),
    ],
)
def test_logs_uri_is_beside_the_checkpoints(source: str, expected: str) -> None:
    spec = DGXDataMountSpec.model_validate({"source": source, "direction": "Out"})
    assert logs_uri(IDENT, spec) == expected
    assert logs_uri(IDENT, spec).rsplit("/", 1)[0] == checkpoint_uri(IDENT, spec).rsplit("/", 1)[0]


@pytest.mark.parametrize(
    ("source", "archive", "expected"),
    [
        ("s3://bucket/out", None, f"s3://bucket/out/final/{RUN}"),
        ("s3://bucket/out/", {"enabled": True}, f"s3://bucket/out/final/{RUN}"),
        ("s3://bucket/out", {"prefix": "runs/2026-11/"}, f"s3://bucket/out/runs/2026-11/{RUN}"),
        ("gs://bucket", {"prefix": "models"}, f"gs://bucket/models/{RUN}"),
    ],
)
def test_archive_uri(source: str, archive: dict[str, Any] | None, expected: str) -> None:
    spec = DGXDataMountSpec.model_validate({"source": source, "direction": "Out", "archive": archive})
    assert archive_uri(IDENT, spec) == expected


def test_out_local_dir_is_per_job_run() -> None:
    assert out_local_dir(IDENT, "ckpt", "/raid/kubedgx") == f"/raid/kubedgx/ml/ckpt/{RUN}"
    other = JobIdentity("job", "team-b", "ffffffff-0000-4000-8000-000000000000")
    assert out_local_dir(other, "ckpt", "/mnt/nvme") == "/mnt/nvme/team-b/ckpt/job-ffffffff"


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({}, (False, False)),
        # An In mount never archives nor syncs checkpoints, whatever it says (admission rejects these).
        ({"archive": {"enabled": True}, "syncCheckpoints": True}, (False, False)),
        (OUT, (True, True)),
        ({**OUT, "syncCheckpoints": True, "archive": {"enabled": True}}, (True, True)),
        ({**OUT, "archive": {"enabled": False}}, (False, True)),
        ({**OUT, "syncCheckpoints": False}, (True, False)),
        ({**OUT, "syncCheckpoints": False, "archive": {"enabled": False}}, (False, False)),
    ],
)
def test_archives_and_syncs_checkpoints(spec: dict[str, Any], expected: tuple[bool, bool]) -> None:
    mount = DGXDataMountSpec.model_validate({"source": "s3://bucket/x", **spec})
    assert (archives(mount), syncs_checkpoints(mount)) == expected


# --- credentials and arguments --------------------------------------------------------------------


@pytest.mark.parametrize("source", ["s3://bucket/x", "gs://bucket/x"])
def test_no_secret_means_ambient_identity(source: str) -> None:
    assert credentials(plan_for("/out", {"source": source})) == ([], [], [])


def test_s3_credentials_are_secret_key_refs_with_an_optional_session_token() -> None:
    plan = plan_for("/out", {"credentialsSecretRef": {"name": "s3-creds"}}, index=2)
    assert credentials(plan) == (S3_SECRET_ENV, [], [])


@pytest.mark.parametrize(("key", "item"), [(None, "service-account.json"), ("sa.json", "sa.json")])
def test_gs_credentials_are_a_mounted_key_file(key: str | None, item: str) -> None:
    ref: dict[str, Any] = {"name": "gcs-creds"} if key is None else {"name": "gcs-creds", "key": key}
    plan = plan_for("/out", {"source": "gs://bucket/x", "credentialsSecretRef": ref}, index=3)
    env, mounts, volumes = credentials(plan)
    assert env == [{"name": "GOOGLE_APPLICATION_CREDENTIALS", "value": "/var/run/kubedgx/credentials-3/key.json"}]
    assert mounts == [{"name": "credentials-3", "mountPath": "/var/run/kubedgx/credentials-3", "readOnly": True}]
    assert volumes == [
        {"name": "credentials-3", "secret": {"secretName": "gcs-creds", "items": [{"key": item, "path": "key.json"}]}}
    ]


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({}, []),
        ({"region": "eu-west-1"}, ["--region", "eu-west-1"]),
        ({"endpoint": "https://minio.storage.svc:9000"}, ["--endpoint-url", "https://minio.storage.svc:9000"]),
        (
            {"endpoint": "http://rgw:8080", "region": "us-east-1"},
            ["--endpoint-url", "http://rgw:8080", "--region", "us-east-1"],
        ),
    ],
)
def test_store_args(spec: dict[str, Any], expected: list[str]) -> None:
    assert store_args(DGXDataMountSpec.model_validate({"source": "s3://bucket/x", **spec})) == expected


def test_filter_args_keep_order_includes_first() -> None:
    spec = DGXDataMountSpec.model_validate(
        {"source": "s3://bucket/x", "exclude": ["*.tmp", "cache/**"], "include": ["train/*.jsonl", "eval/*"]}
    )
    assert filter_args(spec) == [
        "--include",
        "train/*.jsonl",
        "--include",
        "eval/*",
        "--exclude",
        "*.tmp",
        "--exclude",
        "cache/**",
    ]
    assert filter_args(DGXDataMountSpec.model_validate({"source": "s3://bucket/x"})) == []


@pytest.mark.parametrize(
    ("mount_path", "changes", "expected"),
    [
        ("/workspace/output", {}, "/workspace/output"),
        ("/workspace", {}, "/workspace/output"),
        ("/workspace/", {}, "/workspace/output"),
        ("/out", OUT_RUN, "/out/run"),
        ("/out/", OUT_RUN, "/out/run"),
        # Only a directory boundary counts: /outside is not inside /out.
        ("/out", {"spec.trainer.output": {"dir": "/outside/run"}}, "/out"),
        ("/out", {}, "/out"),
        ("/out", {"spec.trainer.output": {"dir": "relative/out"}}, "/out"),
        # A command job writes checkpoint-<step>/ into the mount itself.
        ("/ckpt", COMMAND_MODE, "/ckpt"),
        ("/ckpt/", COMMAND_MODE, "/ckpt"),
    ],
)
def test_watched_dir(mount_path: str, changes: dict[str, Any], expected: str) -> None:
    assert watched_dir(plan_for(mount_path), job_spec(changes)) == expected


def test_watched_dir_of_nested_out_mounts_is_the_deepest_holder() -> None:
    """With Out mounts at /out and /out/run, the output dir /out/run/x is on the inner mount's volume:
    only the inner mount's uploader watches it; the outer one watches its own path."""
    outer, inner = plan_for("/out"), plan_for("/out/run")
    spec = job_spec({"spec.trainer.output": {"dir": "/out/run/x"}})
    assert watched_dir(outer, spec, [outer, inner]) == "/out"
    assert watched_dir(inner, spec, [outer, inner]) == "/out/run/x"


# --- pull init containers (direction In) ----------------------------------------------------------


def test_in_mount_gets_one_pull_init_container() -> None:
    pod = pod_of(refs(("data", "/data")), mounts={"data": {}})
    assert sync_inits(pod) == [
        {
            "name": "data-in-0",
            "image": DEFAULT_TRAINER_IMAGE,
            "imagePullPolicy": "IfNotPresent",
            "command": DATASYNC,
            "args": ["pull", "s3://bucket/prefix", "/data", *COMMON],
            "env": [UNBUFFERED],
            "resources": SYNC_RESOURCES,
            # Writable: the pull fills the directory the trainer then reads.
            "volumeMounts": [{"name": "data-0", "mountPath": "/data"}],
            "terminationMessagePath": "/dev/termination-log",
            "terminationMessagePolicy": "FallbackToLogsOnError",
        }
    ]
    trainer_mount, _ = volume_at(pod, "/data")
    assert trainer_mount == {"name": "data-0", "mountPath": "/data", "readOnly": True}
    assert pod["spec"]["terminationGracePeriodSeconds"] == 120


@pytest.mark.parametrize(
    ("data_cache", "digest", "tail"),
    [
        ("none", None, []),
        ("none", "sha256:abc", ["--expect-digest", "sha256:abc"]),
        ("preload", None, []),  # nothing known to reuse a node copy by
        ("preload", "", []),
        ("preload", "sha256:abc", ["--expect-digest", "sha256:abc", "--reuse"]),
    ],
)
def test_pull_args_digest_and_reuse(data_cache: str, digest: str | None, tail: list[str]) -> None:
    mount = {
        "include": ["train/*"],
        "exclude": ["*.tmp"],
        "endpoint": "https://minio:9000",
        "region": "us-east-1",
    }
    pod = pod_of(
        {**refs(("data", "/data")), "spec.dataCache": data_cache},
        mounts={"data": mount},
        digests={} if digest is None else {"data": digest},
    )
    assert inits(pod)["data-in-0"]["args"] == [
        "pull",
        "s3://bucket/prefix",
        "/data",
        "--include",
        "train/*",
        "--exclude",
        "*.tmp",
        "--endpoint-url",
        "https://minio:9000",
        "--region",
        "us-east-1",
        *COMMON,
        *tail,
    ]


def test_each_pull_gets_its_own_mounts_digest() -> None:
    pod = pod_of(
        {**refs(("data", "/data"), ("models", "/models"), ("extra", "/extra")), "spec.dataCache": "preload"},
        mounts={"data": {}, "models": {"source": "gs://models/base"}, "extra": {}},
        digests={"models": "sha256:m", "unrelated": "sha256:u"},
    )
    assert {name: c["args"][1:3] + c["args"][3 + len(COMMON) :] for name, c in inits(pod).items()} == {
        "data-in-0": ["s3://bucket/prefix", "/data"],
        "data-in-1": ["gs://models/base", "/models", "--expect-digest", "sha256:m", "--reuse"],
        "data-in-2": ["s3://bucket/prefix", "/extra"],
    }


def test_s3_secret_reaches_the_pull_and_never_the_trainer() -> None:
    pod = pod_of(refs(("data", "/data")), mounts={"data": {"credentialsSecretRef": {"name": "s3-creds"}}})
    pull = inits(pod)["data-in-0"]
    assert pull["env"] == [*S3_SECRET_ENV, UNBUFFERED]
    assert pull["volumeMounts"] == [{"name": "data-0", "mountPath": "/data"}]
    assert [v["name"] for v in pod["spec"]["volumes"]] == ["dshm", "trainer-config", "data-0", "output"]
    trainer_env = {e["name"] for e in the_container(pod)["env"]}
    assert trainer_env.isdisjoint({"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"})


# --- restore and the uploader sidecar (direction Out) ----------------------------------------------


def test_out_mount_gets_a_restore_and_a_native_sidecar() -> None:
    pod = pod_of({**refs(("ckpt", "/out")), **OUT_RUN}, mounts={"ckpt": OUT})
    checkpoints = f"s3://bucket/out/{RUN}/checkpoints"
    base = {
        "image": DEFAULT_TRAINER_IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "command": DATASYNC,
        "env": [UNBUFFERED],
        "volumeMounts": [{"name": "data-0", "mountPath": "/out"}],
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    assert sync_inits(pod) == [
        {
            **base,
            "name": "restore-0",
            "args": ["restore", checkpoints, "/out/run", *COMMON],
            "resources": SYNC_RESOURCES,
        },
        {
            **base,
            "name": "checkpoints-0",
            "args": [
                "watch",
                "/out/run",
                checkpoints,
                "--interval",
                "30",
                "--logs",
                f"s3://bucket/out/{RUN}/logs",
                "--archive",
                f"s3://bucket/out/final/{RUN}",
                "--archive-format",
                "files",
                *COMMON,
            ],
            "resources": SIDECAR_RESOURCES,
            "restartPolicy": "Always",
        },
    ]
    assert "restartPolicy" not in inits(pod)["restore-0"]
    # The node directory is this run's, and the trainer writes into it.
    mount, volume = volume_at(pod, "/out")
    assert mount == {"name": "data-0", "mountPath": "/out", "readOnly": False}
    assert volume == {
        "name": "data-0",
        "hostPath": {"path": f"/raid/kubedgx/ml/ckpt/{RUN}", "type": "DirectoryOrCreate"},
    }
    assert pod["spec"]["terminationGracePeriodSeconds"] == 900


@pytest.mark.parametrize(
    ("mount", "names", "watch_tail"),
    [
        (
            {},
            ["restore-0", "checkpoints-0"],
            ["--archive", f"s3://bucket/out/final/{RUN}", "--archive-format", "files"],
        ),
        (
            {"syncCheckpoints": False},  # nothing to restore, nothing to stream: archive only
            ["checkpoints-0"],
            ["--no-checkpoints", "--archive", f"s3://bucket/out/final/{RUN}", "--archive-format", "files"],
        ),
        ({"archive": {"enabled": False}}, ["restore-0", "checkpoints-0"], []),
        ({"syncCheckpoints": False, "archive": {"enabled": False}}, [], None),
        (
            {"archive": {"prefix": "runs/2026-11", "format": "tar.gz"}},
            ["restore-0", "checkpoints-0"],
            ["--archive", f"s3://bucket/out/runs/2026-11/{RUN}", "--archive-format", "tar.gz"],
        ),
    ],
)
def test_out_mount_options(mount: dict[str, Any], names: list[str], watch_tail: list[str] | None) -> None:
    pod = pod_of({**refs(("ckpt", "/out")), **OUT_RUN}, mounts={"ckpt": {**OUT, **mount}})
    assert list(inits(pod)) == names
    if watch_tail is None:
        assert sync_inits(pod) == []
        return
    head = [
        "watch", "/out/run", f"s3://bucket/out/{RUN}/checkpoints", "--interval", "30",
        "--logs", f"s3://bucket/out/{RUN}/logs",
    ]  # fmt: skip
    assert inits(pod)["checkpoints-0"]["args"] == [*head, *watch_tail, *COMMON]


def test_out_mount_store_args_on_restore_and_sidecar() -> None:
    mount = {**OUT, "endpoint": "https://minio:9000", "region": "eu-1"}
    pod = pod_of({**refs(("ckpt", "/out")), **OUT_RUN}, mounts={"ckpt": mount})
    store = ["--endpoint-url", "https://minio:9000", "--region", "eu-1"]
    assert inits(pod)["restore-0"]["args"][3:] == [*store, *COMMON]
    assert inits(pod)["checkpoints-0"]["args"][-8:] == [*store, *COMMON]


def test_command_job_sidecar_watches_the_mount_itself() -> None:
    pod = pod_of({**COMMAND_MODE, **refs(("ckpt", "/ckpt"))}, mounts={"ckpt": OUT})
    assert inits(pod)["restore-0"]["args"][:3] == ["restore", f"s3://bucket/out/{RUN}/checkpoints", "/ckpt"]
    assert inits(pod)["checkpoints-0"]["args"][:3] == ["watch", "/ckpt", f"s3://bucket/out/{RUN}/checkpoints"]


def test_out_mount_without_the_trainer_output_watches_the_mount() -> None:
    pod = pod_of(refs(("ckpt", "/ckpt")), mounts={"ckpt": OUT})
    assert inits(pod)["checkpoints-0"]["args"][1] == "/ckpt"
    _, output = volume_at(pod, "/workspace/output")  # the trainer's output stays on its own emptyDir
    assert output["emptyDir"] == {}


def test_gs_out_mount_credentials_volume_is_shared_by_restore_and_sidecar() -> None:
    mount = {"direction": "Out", "source": "gs://models/out", "credentialsSecretRef": {"name": "gcs"}}
    pod = pod_of({**refs(("ckpt", "/out")), **OUT_RUN}, mounts={"ckpt": mount})
    env = [{"name": "GOOGLE_APPLICATION_CREDENTIALS", "value": "/var/run/kubedgx/credentials-0/key.json"}, UNBUFFERED]
    for name in ("restore-0", "checkpoints-0"):
        assert inits(pod)[name]["env"] == env
        assert inits(pod)[name]["volumeMounts"] == [
            {"name": "data-0", "mountPath": "/out"},
            {"name": "credentials-0", "mountPath": "/var/run/kubedgx/credentials-0", "readOnly": True},
        ]
    assert [v["name"] for v in pod["spec"]["volumes"]] == ["dshm", "trainer-config", "data-0", "credentials-0"]
    assert pod["spec"]["volumes"][-1] == {
        "name": "credentials-0",
        "secret": {"secretName": "gcs", "items": [{"key": "service-account.json", "path": "key.json"}]},
    }
    trainer = the_container(pod)
    assert all(m["name"] != "credentials-0" for m in trainer["volumeMounts"])
    assert all(e["name"] != "GOOGLE_APPLICATION_CREDENTIALS" for e in trainer["env"])


# --- several mounts: order, volumes, grace ----------------------------------------------------------

MIXED_REFS = refs(("ckpt", "/workspace/output"), ("data", "/data"), ("models", "/models"), ("logs", "/logs"))
MIXED_MOUNTS: dict[str, dict[str, Any]] = {
    "ckpt": {"direction": "Out", "source": "gs://ckpt/out", "credentialsSecretRef": {"name": "gcs"}},
    "data": {"credentialsSecretRef": {"name": "s3-creds"}},
    "models": {"source": "gs://models/base", "credentialsSecretRef": {"name": "gcs", "key": "sa.json"}},
    "logs": {"direction": "Out", "source": "s3://bucket/logs", "archive": {"enabled": False}},
}


def test_init_containers_run_pulls_then_restores_then_sidecars() -> None:
    pod = pod_of(MIXED_REFS, mounts=MIXED_MOUNTS)
    assert list(inits(pod)) == [
        "data-in-1",
        "data-in-2",
        "restore-0",
        "restore-3",
        "checkpoints-0",
        "checkpoints-3",
    ]
    assert [c.get("restartPolicy") for c in inits(pod).values()] == [None, None, None, None, "Always", "Always"]
    assert [v["name"] for v in pod["spec"]["volumes"]] == [
        "dshm",
        "trainer-config",
        "data-0",
        "data-1",
        "data-2",
        "data-3",
        "credentials-0",
        "credentials-2",
    ]
    assert inits(pod)["data-in-2"]["volumeMounts"][1]["name"] == "credentials-2"
    assert inits(pod)["checkpoints-3"]["args"][:3] == ["watch", "/logs", f"s3://bucket/logs/{RUN}/checkpoints"]
    # Each sidecar sends the logs to its own mount, beside its checkpoints.
    for name, source in (("checkpoints-0", "gs://ckpt/out"), ("checkpoints-3", "s3://bucket/logs")):
        args = inits(pod)[name]["args"]
        assert args[args.index("--logs") + 1] == f"{source}/{RUN}/logs"


def test_every_worker_gets_the_same_sync_containers() -> None:
    pods = pods_of(children({**MIXED_REFS, "spec.elastic": {"minNodes": 2, "maxNodes": 3}}, mounts=MIXED_MOUNTS))
    assert len(pods) == 3
    assert pods[1]["spec"]["initContainers"] == pods[0]["spec"]["initContainers"]
    assert pods[2]["spec"]["initContainers"] == pods[0]["spec"]["initContainers"]


def test_sync_containers_follow_the_defaults() -> None:
    defaults = Defaults(
        trainer_image="registry.example/trainer:2",
        datasync_image="registry.example/datasync:7",
        image_pull_policy="Always",
        sync_workers=3,
        sync_resources={"cpu": "2", "memory": "3Gi"},
        sidecar_resources={"cpu": "500m", "memory": "512Mi"},
    )
    pod = pod_of(MIXED_REFS, mounts=MIXED_MOUNTS, defaults=defaults)
    for name, container in inits(pod).items():
        assert (container["image"], container["imagePullPolicy"]) == ("registry.example/datasync:7", "Always")
        assert container["args"][-4:] == ["--workers", "3", "--log-format", "json"]
        wanted = (
            {"cpu": "500m", "memory": "512Mi"} if name.startswith("checkpoints-") else {"cpu": "2", "memory": "3Gi"}
        )
        assert container["resources"] == {"requests": wanted, "limits": wanted}
    assert the_container(pod)["image"] == "registry.example/trainer:2"


@pytest.mark.parametrize(
    ("job_resources", "init", "sidecar"),
    [
        # A small job: the pulls and restores fit in its share (a 2-CPU node runs it), the
        # uploader beside the trainer keeps its own.
        ({"cpu": "2", "memory": "3Gi"}, {"cpu": "2", "memory": "3Gi"}, {"cpu": "1", "memory": "1Gi"}),
        ({"cpu": "500m", "memory": "1536Mi"}, {"cpu": "500m", "memory": "1536Mi"}, {"cpu": "1", "memory": "1Gi"}),
        # Equal or larger: the defaults, as written.
        ({"cpu": "4000m", "memory": "4Gi"}, {"cpu": "4", "memory": "4Gi"}, {"cpu": "1", "memory": "1Gi"}),
        ({"cpu": "96", "memory": "1Ti"}, {"cpu": "4", "memory": "4Gi"}, {"cpu": "1", "memory": "1Gi"}),
        # Decimal units compare by value: 4G is less than 4Gi.
        ({"cpu": "8", "memory": "4G"}, {"cpu": "4", "memory": "4G"}, {"cpu": "1", "memory": "1Gi"}),
    ],
)
def test_pulls_and_restores_ask_no_more_than_the_trainer(
    job_resources: dict[str, str], init: dict[str, str], sidecar: dict[str, str]
) -> None:
    """A pod asks its node for the larger of its biggest init container and its containers' sum:
    a pull asking 4 CPUs made a 2-CPU job unschedulable on a 2-CPU node (found on real nodes)."""
    pod = pod_of({**MIXED_REFS, "spec.resources": {**job_resources, "shm": "64Mi"}}, mounts=MIXED_MOUNTS)
    assert the_container(pod)["resources"]["requests"]["cpu"] == job_resources["cpu"]
    seen = set()
    for name, container in inits(pod).items():
        wanted = sidecar if name.startswith("checkpoints-") else init
        assert container["resources"] == {"requests": wanted, "limits": wanted}, name
        seen.add(name.split("-")[0])
    assert {"data", "restore", "checkpoints"} <= seen, seen


def test_the_sidecar_scans_at_the_configured_interval() -> None:
    """KUBEDGX_CHECKPOINT_SYNC_INTERVAL (the chart's dataMounts.checkpointSyncInterval) reaches
    every checkpoint sidecar's --interval; 30 s by default."""
    for interval, shown in ((30.0, "30"), (2.5, "2.5"), (120.0, "120")):
        pod = pod_of(MIXED_REFS, mounts=MIXED_MOUNTS, defaults=Defaults(checkpoint_sync_interval=interval))
        sidecars = [c for name, c in inits(pod).items() if name.startswith("checkpoints-")]
        assert sidecars, inits(pod)
        for container in sidecars:
            args = container["args"]
            assert args[args.index("--interval") + 1] == shown, args


def test_sync_containers_run_the_trainer_image_not_the_jobs_image() -> None:
    pod = pod_of(
        {**refs(("data", "/data")), "spec.image": "registry.example/custom:1"},
        mounts={"data": {}},
        defaults=Defaults(trainer_image="registry.example/trainer:9"),
    )
    assert inits(pod)["data-in-0"]["image"] == "registry.example/trainer:9"
    assert the_container(pod)["image"] == "registry.example/custom:1"


@pytest.mark.parametrize(
    ("mount", "defaults", "grace"),
    [
        (None, Defaults(), 120),
        ({}, Defaults(), 120),
        (OUT, Defaults(), 900),
        ({**OUT, "syncCheckpoints": False}, Defaults(), 900),
        ({**OUT, "archive": {"enabled": False}}, Defaults(), 120),  # checkpoints only: no archive
        (OUT, Defaults(archive_grace_seconds=600), 600),
        (OUT, Defaults(termination_grace_seconds=1200), 1200),  # never lowered
        ({}, Defaults(termination_grace_seconds=30, archive_grace_seconds=600), 30),
    ],
)
def test_grace_period_covers_the_archive_only_when_a_mount_archives(
    mount: dict[str, Any] | None, defaults: Defaults, grace: int
) -> None:
    if mount is None:
        pod = pod_of(mounts={}, defaults=defaults)
    else:
        path = "/workspace/output" if mount.get("direction") == "Out" else "/data"
        pod = pod_of(refs(("m", path)), mounts={"m": mount}, defaults=defaults)
    assert pod["spec"]["terminationGracePeriodSeconds"] == grace
    # torchrun waits half of it for its workers' SIGTERM checkpoint (30 s at least, its own
    # default), then SIGKILLs them; the other half is the checkpoint sidecar's to upload it.
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["PET_SHUTDOWN_TIMEOUT"] == str(max(30, grace // 2))


# --- node paths -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cache", "root", "path"),
    [
        (None, None, f"/raid/kubedgx/ml/ckpt/{RUN}"),
        ({"type": "hostPath", "path": "/mnt/nvme"}, None, f"/mnt/nvme/ml/ckpt/{RUN}"),
        (None, "/scratch", f"/scratch/ml/ckpt/{RUN}"),
    ],
)
def test_out_host_path_is_per_job_run(cache: dict[str, Any] | None, root: str | None, path: str) -> None:
    mount = {**OUT, "cache": cache} if cache else OUT
    defaults = Defaults(cache_root=root) if root else None
    pod = pod_of({**refs(("ckpt", "/out")), **OUT_RUN}, mounts={"ckpt": mount}, defaults=defaults)
    assert volume_at(pod, "/out")[1]["hostPath"] == {"path": path, "type": "DirectoryOrCreate"}


def test_a_new_job_with_an_old_name_gets_new_out_paths_but_shares_inputs() -> None:
    changes = {**refs(("data", "/data"), ("ckpt", "/out")), **OUT_RUN}
    mounts = {"data": {}, "ckpt": OUT}
    first = pod_of(changes, mounts=mounts)
    second = pod_of(changes, mounts=mounts, uid="99999999-aaaa-4bbb-8ccc-dddddddddddd")
    assert volume_at(first, "/out")[1]["hostPath"]["path"] == f"/raid/kubedgx/ml/ckpt/{RUN}"
    assert volume_at(second, "/out")[1]["hostPath"]["path"] == "/raid/kubedgx/ml/ckpt/job-99999999"
    assert volume_at(first, "/data")[1] == volume_at(second, "/data")[1]
    assert volume_at(first, "/data")[1]["hostPath"]["path"] == "/raid/kubedgx/ml/data"
    assert inits(second)["checkpoints-1"]["args"][2] == "s3://bucket/out/job-99999999/checkpoints"


def test_out_mount_with_a_pvc_cache_gets_an_ephemeral_claim() -> None:
    mount = {**OUT, "cache": {"type": "pvc", "size": "100Gi"}}
    pod = pod_of({**refs(("ckpt", "/out")), **OUT_RUN}, mounts={"ckpt": mount})
    _, volume = volume_at(pod, "/out")
    assert volume == {
        "name": "data-0",
        "ephemeral": {
            "volumeClaimTemplate": {
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "100Gi"}}}
            }
        },
    }
    assert list(inits(pod)) == ["restore-0", "checkpoints-0"]


# --- every shape validates against the Kubernetes 1.34 schema ----------------------------------------

DIGEST = "sha256:" + "ab" * 32
VALID: dict[str, tuple[dict[str, Any], dict[str, dict[str, Any]]]] = {
    "s3-in-hostpath": (refs(("data", "/data")), {"data": {}}),
    "s3-in-hostpath-creds-filters-preload": (
        {**refs(("data", "/data")), "spec.dataCache": "preload"},
        {
            "data": {
                "credentialsSecretRef": {"name": "s3-creds"},
                "endpoint": "https://minio:9000",
                "region": "us-east-1",
                "include": ["*.jsonl"],
                "exclude": ["tmp/*"],
                "cache": {"type": "hostPath", "path": "/mnt/nvme"},
            }
        },
    ),
    "s3-in-pvc": (
        refs(("data", "/data")),
        {"data": {"cache": {"type": "pvc", "size": "500Gi", "storageClassName": "local-nvme"}}},
    ),
    "gs-in-creds-pvc": (
        refs(("data", "/data")),
        {
            "data": {
                "source": "gs://bucket/data",
                "credentialsSecretRef": {"name": "gcs", "key": "sa.json"},
                "cache": {"type": "pvc", "size": "1Ti"},
            }
        },
    ),
    "s3-out-creds": ({**refs(("ckpt", "/out")), **OUT_RUN}, {"ckpt": {**OUT, "credentialsSecretRef": {"name": "s"}}}),
    "gs-out-creds-tar-pvc": (
        {**refs(("ckpt", "/workspace/output"))},
        {
            "ckpt": {
                "direction": "Out",
                "source": "gs://bucket/out",
                "credentialsSecretRef": {"name": "gcs"},
                "archive": {"format": "tar.gz", "prefix": "runs/a"},
                "cache": {"type": "pvc", "size": "2Ti", "storageClassName": "local-nvme"},
            }
        },
    ),
    "s3-out-pvc": ({**refs(("ckpt", "/out")), **OUT_RUN}, {"ckpt": {**OUT, "cache": {"type": "pvc", "size": "1Ti"}}}),
    "gs-out-hostpath": (
        {**refs(("ckpt", "/out")), **OUT_RUN},
        {"ckpt": {"direction": "Out", "source": "gs://bucket/out", "cache": {"path": "/mnt/nvme"}}},
    ),
    "out-archive-only": ({**refs(("ckpt", "/out")), **OUT_RUN}, {"ckpt": {**OUT, "syncCheckpoints": False}}),
    "out-checkpoints-only": ({**refs(("ckpt", "/out")), **OUT_RUN}, {"ckpt": {**OUT, "archive": {"enabled": False}}}),
    "out-nothing": (
        {**refs(("ckpt", "/out")), **OUT_RUN},
        {"ckpt": {**OUT, "syncCheckpoints": False, "archive": {"enabled": False}}},
    ),
    "command-out": ({**COMMAND_MODE, **refs(("ckpt", "/ckpt"))}, {"ckpt": OUT}),
    "mixed": ({**MIXED_REFS, "spec.dataCache": "preload"}, MIXED_MOUNTS),
}


@pytest.mark.parametrize("scenario", sorted(VALID))
def test_pods_with_data_mounts_validate(scenario: str) -> None:
    changes, mounts = VALID[scenario]
    built = children(changes, mounts=mounts, digests=dict.fromkeys(mounts, DIGEST))
    assert_valid(built)
    for pod in pods_of(built):
        spec = pod["spec"]
        names = [c["name"] for c in [*spec.get("initContainers", []), *spec["containers"]]]
        assert len(names) == len(set(names))
        volumes = [v["name"] for v in spec["volumes"]]
        assert len(volumes) == len(set(volumes))
        used = {m["name"] for c in [*spec.get("initContainers", []), *spec["containers"]] for m in c["volumeMounts"]}
        assert used == set(volumes)  # every volume mounted somewhere, every mount backed by a volume


def test_valid_scenarios_cover_every_kind_of_mount() -> None:
    """The validation above really sees s3 and gs, In and Out, hostPath and pvc, and each container kind."""
    seen: set[tuple[str, str, str]] = set()
    containers: set[str] = set()
    for changes, mounts in VALID.values():
        for spec in mount_specs(mounts).values():
            cache = spec.cache.type if spec.cache is not None else "hostPath"
            seen.add((spec.source[:2], spec.direction, cache))
        for pod in pods_of(children(changes, mounts=mounts)):
            containers |= {c["name"].rstrip("0123456789") for c in pod["spec"].get("initContainers", [])}
    assert seen >= {
        (scheme, direction, cache)
        for scheme in ("s3", "gs")
        for direction in ("In", "Out")
        for cache in ("hostPath", "pvc")
    }
    assert containers == {"prepare-cache", "data-in-", "restore-", "checkpoints-"}


def test_one_pod_helper_agrees() -> None:
    """render_helpers.one_pod() (no digests) builds the same pod as this module's pod_of()."""
    changes = {**refs(("data", "/data"), ("ckpt", "/out")), **OUT_RUN}
    mounts = {"data": {}, "ckpt": OUT}
    assert one_pod(changes, mounts=mounts) == pod_of(changes, mounts=mounts)
