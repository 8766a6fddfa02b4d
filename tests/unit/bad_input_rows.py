"""Invalid manifests, one row each: the field path a user has to fix, the message, and the layer that
refuses it (the CRD file, the API server, the pods the operator would create, the catalog). Checked
by tests/unit/test_bad_input.py on every side without a cluster, and against a real API server and
the webhook by tests/cluster/test_crds.py and tests/cluster/test_webhook.py."""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

from tests.conftest import BASE_JOB, BASE_MOUNT, DELETE, with_changes

Base = Literal["job", "mount"]
Layer = Literal["crd", "apiserver", "webhook", "catalog"]
Rule = Literal["field", "cel", "list", "meta", "webhook", "catalog"]
#: The four checks a row goes through; a known source bug marks one of them xfail (strict).
Aspect = Literal["cli", "crd-file", "validator", "model"]


class Row(NamedTuple):
    id: str
    base: Base
    changes: dict[str, Any]
    path: str
    message: str
    layer: Layer
    rule: Rule
    #: (aspect, reason) pairs: checks that fail because of a source bug (see the reason).
    bugs: tuple[tuple[Aspect, str], ...] = ()


LONG_NAME = "a" * 51
#: A MIG slice's instance type, and the CEL rule's message for one that asks more than one worker of one process.
MIG = "dgxa100.80g.mig-1g.10gb.debug"
MIG_ONE_WORKER = "a MIG instance runs one worker with one process on its slice"

# fmt: off
ROWS: tuple[Row, ...] = (
    # -- DGXTrainingJob: types, patterns, enums, ranges, unknown and missing fields -----------
    Row("min-nodes-not-int", "job", {"spec.elastic.minNodes": "two"}, "spec.elastic.minNodes",
        "must be of type integer", "crd", "field"),
    Row("instance-malformed", "job", {"spec.instance": "a100-8"}, "spec.instance", 'invalid value "a100-8"',
        "crd", "field"),
    Row("max-duration-not-duration", "job", {"spec.maxDuration": "1 day"}, "spec.maxDuration",
        "must be a Go duration", "crd", "field"),
    Row("max-pending-bare-number", "job", {"spec.maxPending": "90"}, "spec.maxPending", 'invalid value "90"',
        "crd", "field"),
    Row("backoff-limit-negative", "job", {"spec.backoffLimit": -1}, "spec.backoffLimit",
        "should be greater than or equal to 0", "crd", "field"),
    Row("retryable-exit-code-300", "job", {"spec.restartPolicy": "ExitCode", "spec.retryableExitCodes": [300]},
        "spec.retryableExitCodes[0]", "should be less than or equal to 255", "crd", "field"),
    Row("elastic-unknown-field", "job", {"spec.elastic.minNode": 2}, "spec.elastic.minNode",
        "did you mean 'minNodes'", "crd", "field"),
    Row("restart-policy-enum", "job", {"spec.restartPolicy": "Sometimes"}, "spec.restartPolicy",
        'Unsupported value: "Sometimes": supported values: "Never", "OnFailure", "ExitCode"', "crd", "field"),
    Row("priority-enum", "job", {"spec.priority": "urgent"}, "spec.priority",
        'Unsupported value: "urgent": supported values: "low", "normal", "high"', "crd", "field"),
    Row("memory-not-quantity", "job", {"spec.resources.memory": "lots"}, "spec.resources.memory",
        "must be a Kubernetes quantity", "crd", "field"),
    Row("max-seq-length-zero", "job", {"spec.trainer.training.maxSeqLength": 0},
        "spec.trainer.training.maxSeqLength", "should be greater than or equal to 1", "crd", "field"),
    Row("dataset-missing", "job", {"spec.trainer.dataset": DELETE}, "spec.trainer.dataset", "Required value",
        "crd", "field"),
    Row("mount-path-relative", "job", {"spec.dataMounts": [{"name": "corpus", "mountPath": "data"}]},
        "spec.dataMounts[0].mountPath", "must be an absolute path", "crd", "field"),
    Row("name-upper-case", "job", {"metadata.name": "MyJob"}, "metadata.name", "DNS-1035 label", "crd", "field"),
    Row("name-too-long", "job", {"metadata.name": LONG_NAME}, "metadata.name", "at most 50 characters",
        "crd", "field"),
    Row("memory-negative", "job", {"spec.resources.memory": "-1Gi"}, "spec.resources.memory",
        "must be a Kubernetes quantity of at least 0", "crd", "field"),
    Row("cpu-negative-integer", "job", {"spec.resources.cpu": -2}, "spec.resources.cpu",
        "should be greater than or equal to 0", "crd", "field"),
    # -- metadata: the API server's own ObjectMeta checks, which a CRD cannot express ----------------
    Row("label-key-with-space", "job", {"metadata.labels": {"team name": "ml"}}, "metadata.labels",
        'Invalid value: "team name": name part must consist of alphanumeric characters', "apiserver", "meta"),
    Row("label-value-with-slash", "job", {"metadata.labels": {"team": "ml/nlp"}}, "metadata.labels",
        'Invalid value: "ml/nlp": a valid label must be an empty string', "apiserver", "meta"),
    Row("label-key-prefix-upper-case", "job", {"metadata.labels": {"Example.com/team": "ml"}}, "metadata.labels",
        'Invalid value: "Example.com/team": prefix part a lowercase RFC 1123 subdomain', "apiserver", "meta"),
    Row("annotation-key-invalid", "mount", {"metadata.annotations": {"note!": "x"}}, "metadata.annotations",
        'Invalid value: "note!": name part must consist of alphanumeric characters', "apiserver", "meta"),
    Row("finalizer-invalid", "job", {"metadata.finalizers": ["not a finalizer"]}, "metadata.finalizers",
        'Invalid value: "not a finalizer"', "apiserver", "meta"),
    Row("metadata-unknown-field", "job", {"metadata.bogus": 1}, "metadata.bogus", "unknown field",
        "apiserver", "meta"),
    # -- what the pods would get: the API server refuses it only when the operator creates them ------
    Row("node-selector-key-with-space", "job", {"spec.nodeSelector": {"gpu type": "h100"}}, "spec.nodeSelector",
        'Invalid value: "gpu type": name part must consist', "webhook", "webhook"),
    Row("node-selector-value-invalid", "job", {"spec.nodeSelector": {"example.com/gpu": "h100 sxm"}},
        "spec.nodeSelector", 'Invalid value: "h100 sxm": a valid label must be an empty string', "webhook",
        "webhook"),
    # The Service would list the master port twice (422 Duplicate value) and no worker would be made.
    Row("rendezvous-port-is-the-master-port", "job", {"spec.elastic.rendezvous.port": 23456},
        "spec.elastic.rendezvous.port", "must differ from 23456, the master port kubedgx opens", "webhook",
        "webhook"),
    # 999999h (the schema's largest part) is 3.6e9 s: past the int32 of a pod's activeDeadlineSeconds.
    Row("max-duration-past-the-pod-deadline", "job", {"spec.maxDuration": "999999h"}, "spec.maxDuration",
        "must be at most 2147483647s", "webhook", "webhook"),
    Row("toleration-key-with-space", "job", {"spec.tolerations": [{"key": "gpu type", "operator": "Exists"}]},
        "spec.tolerations[0].key", 'Invalid value: "gpu type": name part must consist', "webhook", "webhook"),
    Row("toleration-without-key-not-exists", "job", {"spec.tolerations": [{"value": "x", "effect": "NoSchedule"}]},
        "spec.tolerations[0].operator", "must be Exists when key is empty", "webhook", "webhook"),
    Row("toleration-value-invalid", "job", {"spec.tolerations": [{"key": "team", "value": "ml team"}]},
        "spec.tolerations[0].value", 'Invalid value: "ml team": a valid label must be', "webhook", "webhook"),
    Row("env-field-ref-unsupported", "job",
        {"spec.env": [{"name": "PHASE", "valueFrom": {"fieldRef": {"fieldPath": "status.phase"}}}]},
        "spec.env[0].valueFrom.fieldRef.fieldPath", 'Invalid value: "status.phase": not a pod field', "webhook",
        "webhook"),
    Row("env-field-ref-bad-label-key", "job",
        {"spec.env": [{"name": "TEAM", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['a b']"}}}]},
        "spec.env[0].valueFrom.fieldRef.fieldPath", 'Invalid value: "a b": name part must consist', "webhook",
        "webhook"),
    Row("env-resource-field-ref-unsupported", "job",
        {"spec.env": [{"name": "GPUS", "valueFrom": {"resourceFieldRef": {"resource": "limits.nvidia.com/gpu"}}}]},
        "spec.env[0].valueFrom.resourceFieldRef.resource", "not a container resource the API server exposes",
        "webhook", "webhook"),
    # -- DGXTrainingJob: CEL cross-field rules ---------------------------------------------------
    Row("min-nodes-above-max", "job", {"spec.elastic": {"minNodes": 3, "maxNodes": 2}}, "spec.elastic.minNodes",
        "must be <= spec.elastic.maxNodes", "crd", "cel"),
    Row("trainer-and-command", "job", {"spec.command": ["torchrun", "/app/train.py"]}, "spec.command",
        "mutually exclusive", "crd", "cel"),
    Row("neither-trainer-nor-command", "job", {"spec.trainer": DELETE}, "spec",
        "set one of spec.trainer", "crd", "cel"),
    Row("max-duration-zero", "job", {"spec.maxDuration": "0s"}, "spec.maxDuration", "must be longer than 0s",
        "crd", "cel"),
    Row("env-reserved-prefix", "job", {"spec.env": [{"name": "PET_NNODES", "value": "2"}]}, "spec.env[0].name",
        "is reserved", "crd", "cel"),
    Row("env-reserved-name-second", "job",
        {"spec.env": [{"name": "NCCL_DEBUG", "value": "INFO"}, {"name": "MASTER_ADDR", "value": "10.0.0.1"}]},
        "spec.env[1].name", "kubedgx sets MASTER_ADDR", "crd", "cel"),
    Row("env-value-and-value-from", "job",
        {"spec.env": [{"name": "TOKEN", "value": "x", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]},
        "spec.env[0].valueFrom", "set value or valueFrom, not both", "crd", "cel"),
    Row("env-value-from-empty", "job", {"spec.env": [{"name": "TOKEN", "valueFrom": {}}]}, "spec.env[0].valueFrom",
        "set exactly one of secretKeyRef", "crd", "cel"),
    Row("retryable-codes-on-failure", "job", {"spec.restartPolicy": "OnFailure", "spec.retryableExitCodes": [137]},
        "spec.retryableExitCodes", "only with restartPolicy: ExitCode", "crd", "cel"),
    Row("interactive-two-nodes", "job", {"spec.debug.interactive": True, "spec.elastic.maxNodes": 2},
        "spec.debug.interactive", "exactly one worker", "crd", "cel"),
    Row("gpu-above-instance", "job", {"spec.resources.gpu": 9}, "spec.resources.gpu",
        "must be <= 8, the GPUs per node of dgxa100.80g.8.norm", "crd", "cel"),
    Row("nproc-above-instance", "job", {"spec.instance": "dgxa100.80g.4.norm", "spec.elastic.nprocPerNode": 5},
        "spec.elastic.nprocPerNode",
        "must be <= 4, the GPUs per node of dgxa100.80g.4.norm: torchrun starts one process per GPU", "crd", "cel"),
    Row("mig-two-workers", "job", {"spec.instance": MIG, "spec.elastic.maxNodes": 2}, "spec.instance",
        MIG_ONE_WORKER, "crd", "cel"),
    Row("mig-min-nodes-two", "job", {"spec.instance": MIG, "spec.elastic": {"minNodes": 2, "maxNodes": 2}},
        "spec.instance", MIG_ONE_WORKER, "crd", "cel"),
    Row("mig-two-processes", "job", {"spec.instance": MIG, "spec.elastic.nprocPerNode": 2}, "spec.instance",
        MIG_ONE_WORKER, "crd", "cel"),
    Row("mig-resources-gpu", "job", {"spec.instance": MIG, "spec.resources.gpu": 1}, "spec.instance",
        MIG_ONE_WORKER, "crd", "cel"),
    Row("quantization-4-and-8-bit", "job",
        {"spec.trainer.quantization": {"loadIn4bit": True, "loadIn8bit": True}},
        "spec.trainer.quantization.loadIn8bit", "mutually exclusive", "crd", "cel"),
    Row("eval-steps-without-eval-data", "job", {"spec.trainer.training.evalSteps": 50},
        "spec.trainer.training.evalSteps", "evalFraction > 0", "crd", "cel"),
    Row("lora-all-linear-not-alone", "job", {"spec.trainer.lora.targetModules": ["all-linear", "q_proj"]},
        "spec.trainer.lora.targetModules", "list it alone", "crd", "cel"),
    Row("mounts-share-mount-path", "job",
        {"spec.dataMounts": [{"name": "a", "mountPath": "/data"}, {"name": "b", "mountPath": "/data"}]},
        "spec.dataMounts", "share one mountPath", "crd", "cel"),
    Row("preload-without-mounts", "job", {"spec.dataCache": "preload"}, "spec.dataCache",
        "needs at least one entry in spec.dataMounts", "crd", "cel"),
    Row("args-without-command", "job", {"spec.args": ["--epochs", "3"]}, "spec.args", "args need spec.command",
        "crd", "cel"),
    Row("toleration-exists-with-value", "job",
        {"spec.tolerations": [{"key": "team", "operator": "Exists", "value": "ml"}]},
        "spec.tolerations[0].value", "leave value empty", "crd", "cel"),
    Row("toleration-seconds-without-no-execute", "job",
        {"spec.tolerations": [{"key": "team", "effect": "NoSchedule", "tolerationSeconds": 60}]},
        "spec.tolerations[0].tolerationSeconds", "only to effect NoExecute", "crd", "cel"),
    # -- DGXTrainingJob: list-type uniqueness ----------------------------------------------------
    Row("env-duplicate-names", "job",
        {"spec.env": [{"name": "NCCL_DEBUG", "value": "INFO"}, {"name": "NCCL_DEBUG", "value": "WARN"}]},
        "spec.env[1]", 'Duplicate value: {"name":"NCCL_DEBUG"}', "crd", "list"),
    # -- DGXTrainingJob: rules that need the instance catalog -----------------------------------
    Row("instance-unknown-shape", "job", {"spec.instance": "dgxa100.80g.16.norm"}, "spec.instance",
        "unknown instance type 'dgxa100.80g.16.norm'", "catalog", "catalog"),
    Row("node-selector-overrides-capacity", "job",
        {"spec.instance": "dgxh100.80g.8.spot", "spec.nodeSelector": {"kubedgx.io/capacity": "norm"}},
        'spec.nodeSelector["kubedgx.io/capacity"]', "is decided by spec.instance", "catalog", "catalog"),
    Row("gb200-beyond-nvlink-domain", "job", {"spec.instance": "dgxgb200.186g.4.norm", "spec.elastic.maxNodes": 20},
        "spec.elastic.maxNodes", "NVLink domain of 18 nodes", "catalog", "catalog"),
    # -- DGXDataMount ------------------------------------------------------------------------------
    Row("mount-source-http", "mount", {"spec.source": "http://bucket/x"}, "spec.source",
        "must be an object-store URI", "crd", "field"),
    Row("mount-source-upper-case-bucket", "mount", {"spec.source": "s3://B"}, "spec.source", 'invalid value "s3://B"',
        "crd", "field"),
    Row("mount-direction-enum", "mount", {"spec.direction": "Both"}, "spec.direction",
        'Unsupported value: "Both": supported values: "In", "Out"', "crd", "field"),
    Row("mount-endpoint-port-out-of-range", "mount", {"spec.endpoint": "https://minio.storage.svc:99999"},
        "spec.endpoint", "invalid endpoint URL", "webhook", "webhook"),
    Row("mount-endpoint-with-credentials", "mount", {"spec.endpoint": "https://user:secret@minio:9000"},
        "spec.endpoint", "credentials do not belong in it", "webhook", "webhook"),
    Row("mount-region-with-spaces", "mount", {"spec.region": "us east 1"}, "spec.region", "invalid region",
        "webhook", "webhook"),
    Row("mount-source-missing", "mount", {"spec.source": DELETE}, "spec.source", "Required value", "crd", "field"),
    Row("mount-endpoint-with-gs-port-out-of-range", "mount",
        {"spec.source": "gs://bucket/prefix", "spec.endpoint": "https://storage-psc.p.googleapis.com:99999"},
        "spec.endpoint", "invalid endpoint URL", "webhook", "webhook"),
    Row("mount-region-with-gs", "mount", {"spec.source": "gs://bucket/prefix", "spec.region": "us-east-1"},
        "spec.region", "only to s3:// sources", "crd", "cel"),
    Row("mount-archive-direction-in", "mount", {"spec.direction": "In", "spec.archive": {"prefix": "final"}},
        "spec.archive", "only to direction: Out", "crd", "cel"),
    Row("mount-pvc-without-size", "mount", {"spec.cache": {"type": "pvc"}}, "spec.cache.size",
        "a pvc cache needs a size", "crd", "cel"),
    Row("mount-credentials-key-with-s3", "mount", {"spec.credentialsSecretRef": {"name": "aws", "key": "creds"}},
        "spec.credentialsSecretRef.key", "credentialsSecretRef.key is for gs://", "crd", "cel"),
)
# fmt: on

BASES: dict[Base, dict[str, Any]] = {"job": BASE_JOB, "mount": BASE_MOUNT}


def manifest(row: Row) -> dict[str, Any]:
    return with_changes(BASES[row.base], row.changes)


CRD_ROWS = [r for r in ROWS if r.layer == "crd"]
APISERVER_ROWS = [r for r in ROWS if r.layer == "apiserver"]
WEBHOOK_ROWS = [r for r in ROWS if r.layer == "webhook"]
CATALOG_ROWS = [r for r in ROWS if r.layer == "catalog"]

#: Next to each webhook row, what the API server takes in the same field: the rules must not refuse it.
ACCEPTED_NEAR_WEBHOOK_ROWS: dict[str, dict[str, Any]] = {
    "rendezvous-port-next-to-the-master-port": {"spec.elastic.rendezvous.port": 23457},
    "max-duration-at-the-pod-deadline": {"spec.maxDuration": "596523h14m7s"},
    "toleration-of-every-taint": {"spec.tolerations": [{"operator": "Exists"}]},
    "toleration-equal-empty-value": {"spec.tolerations": [{"key": "example.com/team", "effect": "NoSchedule"}]},
    "env-field-refs": {
        "spec.env": [
            {"name": f"F{i}", "valueFrom": {"fieldRef": {"fieldPath": path, **extra}}}
            for i, (path, extra) in enumerate(
                [
                    ("status.podIP", {}),
                    ("spec.host", {}),  # the old name of spec.nodeName, which the API server still converts
                    ("metadata.labels['example.com/team']", {"apiVersion": "v1"}),
                    ("metadata.annotations['Example.com/Note']", {}),  # annotation keys are compared lower-cased
                ]
            )
        ]
    },
    "env-resource-field-refs": {
        "spec.env": [
            {"name": "MEM", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory"}}},
            {"name": "HUGE", "valueFrom": {"resourceFieldRef": {"resource": "requests.hugepages-2Mi"}}},
        ]
    },
}
