#!/usr/bin/env bash
# The kubedgx e2e tests on a throwaway kind cluster, in one command (from anywhere in the repo):
#
#   bash tests/e2e/run.sh [--keep] [--reuse] [-- PYTEST_ARGS...]
#
#   --keep    keep the cluster afterwards (default: deleted on exit, pass or fail)
#   --reuse   test on an existing kind cluster of that name instead of refusing to touch it
#             (a reused cluster is never deleted)
#   -- ...    passed to pytest, e.g. -- -k elastic -x
#
# What it does, printing every command: creates a kind cluster (tests/e2e/kind-config.yaml: one
# control plane, three workers); turns the workers into fake DGX nodes of $KUBEDGX_E2E_INSTANCE
# (GPU Feature Discovery labels, an nvidia.com/gpu capacity patched into node status, the
# nvidia.com/gpu taint of a GPU pool) and untaints the control plane, where the operator runs;
# builds the operator and trainer images (or takes prebuilt ones) and loads them into kind;
# installs the Helm chart with tests/e2e/values-e2e.yaml and waits for the operator and its
# webhook; runs `python -m pytest tests/e2e` with KUBEDGX_E2E=1 against that cluster's context only.
#
# Environment:
#   KUBEDGX_E2E_CLUSTER         kind cluster name (default kubedgx-e2e; its context is kind-<name>)
#   KUBEDGX_E2E_INSTANCE        catalog instance type the workers pass for (default dgxh100.80g.8.norm)
#   KUBEDGX_E2E_OPERATOR_IMAGE  a prebuilt operator image (name:tag) instead of building one
#   KUBEDGX_E2E_TRAINER_IMAGE   a prebuilt trainer image instead of building one (it is large:
#                               NVIDIA's PyTorch base is ~20 GB; build it once and point here)
#   KUBEDGX_E2E_LOGS            on failure, `kind export logs` into this directory
#   KIND_NODE_IMAGE             kindest/node image (default: the one of your kind version)
#   PYTHON                      Python with kubedgx and its test extra (default: python)
# and the pytest part's own: KUBEDGX_E2E_TIMEOUT, KUBEDGX_E2E_QUICKSTART_TIMEOUT, ... (README.md).
#
# Written for bash 3.2 too (macOS): no mapfile, no associative arrays.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."

CLUSTER=${KUBEDGX_E2E_CLUSTER:-kubedgx-e2e}
CONTEXT=kind-$CLUSTER
RELEASE=kubedgx
NAMESPACE=kubedgx
INSTANCE=${KUBEDGX_E2E_INSTANCE:-dgxh100.80g.8.norm}
PYTHON=${PYTHON:-python}
CHART=./charts/kubedgx
VALUES=tests/e2e/values-e2e.yaml
KEEP=0
REUSE=0
OURS=0    # the cluster is the one we test on (created or reused): diagnostics may look at it
CREATED=0 # we created it: delete it on exit unless --keep
PYTEST_ARGS=()

usage() { sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; }

while (($# > 0)); do
	case $1 in
	--keep) KEEP=1 ;;
	--reuse) REUSE=1 ;;
	-h | --help)
		usage
		exit 0
		;;
	--)
		shift
		PYTEST_ARGS=("$@")
		break
		;;
	*)
		echo "run.sh: unknown argument: $1" >&2
		usage >&2
		exit 2
		;;
	esac
	shift
done

step() { printf '\n=== %s (%s)\n' "$*" "$(date -u +%H:%M:%S)"; }
say() { printf '+ %s\n' "$*"; }
die() {
	printf 'run.sh: error: %s\n' "$*" >&2
	exit 1
}
run() {
	say "$*"
	"$@"
}
# kubectl, always on the e2e cluster's context, never the current one: printed (kc) or quiet (kq).
kc() {
	say "kubectl --context $CONTEXT $*"
	kubectl --context "$CONTEXT" "$@"
}
kq() { kubectl --context "$CONTEXT" "$@"; }
# Non-empty lines of $1 into the array OUT_LINES.
to_lines() {
	OUT_LINES=()
	local line
	while IFS= read -r line; do
		if [[ -n $line ]]; then OUT_LINES+=("$line"); fi
	done <<<"$1"
}
# name[:tag] -> IMAGE_REPO, IMAGE_TAG (a registry port is not a tag; digests are refused).
split_image() {
	local ref=$1 last
	[[ $ref != *@* ]] || die "image $ref: give a tag, not a digest"
	last=${ref##*/}
	if [[ $last == *:* ]]; then
		IMAGE_REPO=${ref%:*}
		IMAGE_TAG=${ref##*:}
	else
		IMAGE_REPO=$ref
		IMAGE_TAG=latest
	fi
}
cluster_exists() { kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; }

cleanup() {
	local rc=$?
	set +e
	if ((rc != 0 && OURS)) && cluster_exists; then
		step "FAILED (exit $rc): the cluster as it was"
		kq get nodes -o wide
		kq get pods -A -o wide
		kq get dgxtrainingjobs.kubedgx.io -A 2>/dev/null
		helm status "$RELEASE" --kube-context "$CONTEXT" -n "$NAMESPACE" 2>/dev/null
		for pod in $(kq -n "$NAMESPACE" get pods -o name 2>/dev/null); do
			step "logs of $NAMESPACE/$pod"
			kq -n "$NAMESPACE" logs "$pod" --all-containers --tail=200
		done
		if [[ -n ${KUBEDGX_E2E_LOGS:-} ]]; then
			run kind export logs --name "$CLUSTER" "$KUBEDGX_E2E_LOGS"
		fi
	fi
	if ((CREATED && KEEP)); then
		step "keeping the cluster (--keep): kubectl --context $CONTEXT ...; delete it with: kind delete cluster --name $CLUSTER"
	elif ((CREATED)); then
		step "deleting the kind cluster"
		run kind delete cluster --name "$CLUSTER"
	elif ((OURS)); then
		step "leaving the reused cluster $CLUSTER in place"
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

step "prerequisites"
missing=()
for tool in kind kubectl helm docker "$PYTHON"; do
	command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
((${#missing[@]} == 0)) || die "not on PATH: ${missing[*]} (tests/e2e/README.md lists the prerequisites)"
docker info >/dev/null 2>&1 || die "docker cannot reach its daemon (docker info failed)"
"$PYTHON" -c 'import dgx_operator, pytest, yaml' ||
	die "$PYTHON cannot import kubedgx and pytest: pip install -e ./api -e ./datasync -e ./trainer -e '.[test]' (or set PYTHON)"
[[ -f $CHART/Chart.yaml ]] || die "no Helm chart at $CHART"
say "$(kind version)"
say "$(kubectl version --client 2>/dev/null | head -n 1)"
say "helm $(helm version --short)"
say "docker $(docker version --format '{{.Server.Version}}')"
say "instance type the workers pass for: $INSTANCE"

step "kind cluster $CLUSTER (context $CONTEXT)"
if cluster_exists; then
	((REUSE)) || die "a kind cluster named $CLUSTER exists already: pass --reuse to test on it, or delete it (kind delete cluster --name $CLUSTER)"
	OURS=1
	say "reusing it (--reuse)"
else
	create=(kind create cluster --name "$CLUSTER" --config tests/e2e/kind-config.yaml --wait 180s)
	if [[ -n ${KIND_NODE_IMAGE:-} ]]; then create+=(--image "$KIND_NODE_IMAGE"); fi
	CREATED=1 # before creating: a half-made cluster is deleted too
	OURS=1
	run "${create[@]}"
fi
kc wait --for=condition=Ready nodes --all --timeout=180s

step "fake GPU nodes: the workers pass for $INSTANCE"
text=$("$PYTHON" -m tests.e2e.fakegpu labels "$INSTANCE")
to_lines "$text"
((${#OUT_LINES[@]} > 0)) || die "no node labels for $INSTANCE"
LABELS=("${OUT_LINES[@]}")
text=$("$PYTHON" -m tests.e2e.fakegpu taints "$INSTANCE")
to_lines "$text"
TAINTS=(${OUT_LINES[@]+"${OUT_LINES[@]}"})
GPUS=$("$PYTHON" -m tests.e2e.fakegpu gpus "$INSTANCE")
text=$(kq get nodes -l '!node-role.kubernetes.io/control-plane' -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}')
to_lines "$text"
((${#OUT_LINES[@]} > 0)) || die "the cluster has no worker nodes"
WORKERS=("${OUT_LINES[@]}")
# The extended resource the NVIDIA device plugin would advertise, written into node status the way
# the Kubernetes docs add one (a JSON patch of status.capacity; "~1" is the escaped "/"). The
# kubelet keeps extended resources it does not manage and copies capacity into allocatable; we
# set both so the scheduler sees them at once.
patch="[{\"op\":\"add\",\"path\":\"/status/capacity/nvidia.com~1gpu\",\"value\":\"$GPUS\"},"
patch+="{\"op\":\"add\",\"path\":\"/status/allocatable/nvidia.com~1gpu\",\"value\":\"$GPUS\"}]"
for node in "${WORKERS[@]}"; do
	kc label node "$node" --overwrite "${LABELS[@]}"
	if ((${#TAINTS[@]} > 0)); then kc taint node "$node" --overwrite "${TAINTS[@]}"; fi
	kc patch node "$node" --subresource=status --type=json -p "$patch"
done
for node in "${WORKERS[@]}"; do
	kc wait "node/$node" --for=jsonpath='{.status.allocatable.nvidia\.com/gpu}'="$GPUS" --timeout=60s
done
# The control plane's NoSchedule taint goes: with every worker tainted as a GPU node, it is where
# the operator (and nothing GPU-bound) runs, as on a cluster with a separate system pool.
if kq get nodes -l node-role.kubernetes.io/control-plane -o jsonpath='{.items[*].spec.taints[*].key}' |
	grep -qw node-role.kubernetes.io/control-plane; then
	kc taint nodes -l node-role.kubernetes.io/control-plane node-role.kubernetes.io/control-plane:NoSchedule-
fi
columns='NAME:.metadata.name,PRODUCT:.metadata.labels.nvidia\.com/gpu\.product'
columns+=',COUNT:.metadata.labels.nvidia\.com/gpu\.count,GPUS:.status.allocatable.nvidia\.com/gpu,TAINTS:.spec.taints[*].key'
kc get nodes -o custom-columns="$columns"

step "images"
if [[ -n ${KUBEDGX_E2E_OPERATOR_IMAGE:-} ]]; then
	OPERATOR_IMAGE=$KUBEDGX_E2E_OPERATOR_IMAGE
	docker image inspect "$OPERATOR_IMAGE" >/dev/null 2>&1 || run docker pull "$OPERATOR_IMAGE"
else
	OPERATOR_IMAGE=kubedgx/operator:e2e
	run docker build -f Dockerfile.operator -t "$OPERATOR_IMAGE" .
fi
if [[ -n ${KUBEDGX_E2E_TRAINER_IMAGE:-} ]]; then
	TRAINER_IMAGE=$KUBEDGX_E2E_TRAINER_IMAGE
	docker image inspect "$TRAINER_IMAGE" >/dev/null 2>&1 || run docker pull "$TRAINER_IMAGE"
else
	TRAINER_IMAGE=kubedgx/trainer:e2e
	say "building the trainer image: NVIDIA's PyTorch base is ~20 GB (KUBEDGX_E2E_TRAINER_IMAGE skips this)"
	run docker build -f Dockerfile.trainer -t "$TRAINER_IMAGE" .
fi
split_image "$OPERATOR_IMAGE"
OPERATOR_REPO=$IMAGE_REPO
OPERATOR_TAG=$IMAGE_TAG
# :latest makes Kubernetes pull Always, and a kind-loaded image cannot be pulled.
[[ $OPERATOR_TAG != latest ]] || die "operator image $OPERATOR_IMAGE: tag it with something other than latest"
split_image "$TRAINER_IMAGE"
TRAINER_REPO=$IMAGE_REPO
TRAINER_TAG=$IMAGE_TAG
run kind load docker-image --name "$CLUSTER" "$OPERATOR_IMAGE"
# Only the GPU workers run training pods: the large image goes to them alone.
nodes_csv=$(
	IFS=,
	echo "${WORKERS[*]}"
)
run kind load docker-image --name "$CLUSTER" --nodes "$nodes_csv" "$TRAINER_IMAGE"

step "helm install $RELEASE ($CHART) into $NAMESPACE"
# The trainer image's values key: trainer.image.* (the chart's values.yaml) or trainerImage.*;
# the chart's schema rejects unknown keys, so ask its values.yaml which one it has.
TRAINER_KEY=$("$PYTHON" - "$CHART/values.yaml" <<'PY'
import sys

import yaml

with open(sys.argv[1]) as f:
    values = yaml.safe_load(f) or {}
if isinstance((values.get("trainer") or {}).get("image"), dict):
    print("trainer.image")
elif isinstance(values.get("trainerImage"), dict):
    print("trainerImage")
else:
    sys.exit(f"run.sh: {sys.argv[1]} has neither trainer.image nor trainerImage")
PY
)
run helm upgrade --install "$RELEASE" "$CHART" --kube-context "$CONTEXT" \
	--namespace "$NAMESPACE" --create-namespace \
	--values "$VALUES" \
	--set-string image.repository="$OPERATOR_REPO" --set-string image.tag="$OPERATOR_TAG" \
	--set-string "$TRAINER_KEY.repository=$TRAINER_REPO" --set-string "$TRAINER_KEY.tag=$TRAINER_TAG" \
	--wait --timeout 5m
kc wait --for=condition=Established --timeout=60s crd/dgxtrainingjobs.kubedgx.io crd/dgxdatamounts.kubedgx.io
deployments=$(kq -n "$NAMESPACE" get deployments -o name)
[[ -n $deployments ]] || die "the chart created no Deployment in $NAMESPACE"
for deployment in $deployments; do
	kc -n "$NAMESPACE" rollout status "$deployment" --timeout=300s
done

step "waiting until the admission webhook refuses a bad job"
# The operator publishes its webhook configuration once it serves; until then a bad job may be
# stored (it is deleted again) or refused for want of an endpoint. Only "denied" means ready.
probe=$("$PYTHON" -c 'import yaml
from tests.e2e.jobs import unknown_instance_job
print(yaml.safe_dump(unknown_instance_job("kubedgx-e2e-webhook-probe")))')
deadline=$((SECONDS + 180))
while :; do
	if answer=$(kq -n default create -f - <<<"$probe" 2>&1); then
		kq -n default delete dgxtrainingjobs.kubedgx.io kubedgx-e2e-webhook-probe --ignore-not-found --wait=false >/dev/null
	elif grep -q "denied the request" <<<"$answer"; then
		say "$answer"
		break
	fi
	((SECONDS < deadline)) || die "the webhook did not refuse a bad job within 180 s; last answer: $answer"
	sleep 3
done

step "pytest tests/e2e"
export KUBEDGX_E2E=1 KUBEDGX_E2E_CONTEXT="$CONTEXT" KUBEDGX_E2E_INSTANCE="$INSTANCE"
export KUBEDGX_E2E_OPERATOR_NAMESPACE="$NAMESPACE"
run "$PYTHON" -m pytest tests/e2e -v -rs -p no:cacheprovider ${PYTEST_ARGS[@]+"${PYTEST_ARGS[@]}"}
step "e2e passed"
