#!/usr/bin/env bash
# Manual smoke check of the binaries build.sh made (not a test file): start
# etcd + kube-apiserver on free loopback ports with freshly generated certs,
# check /readyz and /version with the admin client cert; with --full also
# start kube-controller-manager, kube-scheduler and kwok, create a fake GPU
# node and a pod, and wait for kwok to make the pod Running. Everything it
# starts is stopped on exit (by pid), and its temp dir removed (KEEP=1 keeps it).
#   tests/cluster/smoke.sh [--full]
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
FULL=0; [ "${1:-}" = --full ] && FULL=1
BIN=$("$HERE/build.sh" --print-bin-dir) || { echo "smoke: run $HERE/build.sh first" >&2; exit 1; }
# shellcheck disable=SC1091
. "$BIN/versions.env"

base=/tmp; [ -d /dev/shm ] && [ -w /dev/shm ] && base=/dev/shm
D=$(mktemp -d "$base/kubedgx-smoke.XXXXXX")
PIDS=()
cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  if [ "${KEEP:-0}" = 1 ]; then echo "smoke: kept $D"; else rm -rf "$D"; fi
}
trap cleanup EXIT
now() { date +%s.%N; }
T0=$(now)
ts() { awk -v a="$T0" -v b="$(now)" 'BEGIN { printf "%6.1fs", b - a }'; }
say() { echo "smoke [$(ts)]: $*"; }
fail() { echo "smoke: FAIL: $*" >&2; for f in "$D"/*.log; do echo "--- tail $f" >&2; tail -n 20 "$f" >&2; done; exit 1; }

# Six distinct free ports, below the ephemeral range (tests/support/ports.py).
read -r P_ETCD P_PEER P_API P_KCM P_SCHED P_KWOK < <(cd "$HERE/../.." && python3 -c \
  'from tests.support.ports import free_port; print(*(free_port() for _ in range(6)))')
say "dir $D; ports etcd=$P_ETCD peer=$P_PEER apiserver=$P_API kcm=$P_KCM scheduler=$P_SCHED kwok=$P_KWOK"

mkdir -p "$D/pki" "$D/etcd"
(
  cd "$D/pki"
  openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj /CN=test-ca -keyout ca.key -out ca.crt
  openssl req -newkey rsa:2048 -nodes -subj /CN=kube-apiserver -keyout apiserver.key -out apiserver.csr
  openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 30 -out apiserver.crt \
    -extfile <(printf 'subjectAltName=IP:127.0.0.1,DNS:localhost,IP:10.96.0.1\nextendedKeyUsage=serverAuth\n')
  openssl req -newkey rsa:2048 -nodes -subj "/CN=admin/O=system:masters" -keyout admin.key -out admin.csr
  openssl x509 -req -in admin.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 30 -out admin.crt \
    -extfile <(echo "extendedKeyUsage=clientAuth")
  openssl genrsa -out sa.key 2048 && openssl rsa -in sa.key -pubout -out sa.pub
) > "$D/openssl.log" 2>&1 || fail "openssl"
say "certs generated"

cat > "$D/admin.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: t, cluster: {server: "https://127.0.0.1:$P_API", certificate-authority: $D/pki/ca.crt}}]
users: [{name: admin, user: {client-certificate: $D/pki/admin.crt, client-key: $D/pki/admin.key}}]
contexts: [{name: t, context: {cluster: t, user: admin}}]
current-context: t
EOF

"$BIN/etcd" --name=n0 --data-dir="$D/etcd" --unsafe-no-fsync=true \
  --listen-client-urls="http://127.0.0.1:$P_ETCD" --advertise-client-urls="http://127.0.0.1:$P_ETCD" \
  --listen-peer-urls="http://127.0.0.1:$P_PEER" --initial-advertise-peer-urls="http://127.0.0.1:$P_PEER" \
  --initial-cluster="n0=http://127.0.0.1:$P_PEER" --listen-metrics-urls= \
  > "$D/etcd.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 60); do curl -sf "http://127.0.0.1:$P_ETCD/health" >/dev/null && break; sleep 0.5; done
curl -sf "http://127.0.0.1:$P_ETCD/health" >/dev/null || fail "etcd /health"
say "etcd healthy: $(curl -s "http://127.0.0.1:$P_ETCD/health")"

"$BIN/kube-apiserver" --etcd-servers="http://127.0.0.1:$P_ETCD" \
  --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$P_API" \
  --cert-dir="$D/pki" --tls-cert-file="$D/pki/apiserver.crt" --tls-private-key-file="$D/pki/apiserver.key" \
  --client-ca-file="$D/pki/ca.crt" --authorization-mode=Node,RBAC --allow-privileged=true \
  --service-cluster-ip-range=10.96.0.0/16 \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --service-account-key-file="$D/pki/sa.pub" --service-account-signing-key-file="$D/pki/sa.key" \
  --endpoint-reconciler-type=none \
  --default-not-ready-toleration-seconds=10 --default-unreachable-toleration-seconds=10 \
  > "$D/kube-apiserver.log" 2>&1 &
PIDS+=($!)
CURL=(curl -s --cacert "$D/pki/ca.crt" --cert "$D/pki/admin.crt" --key "$D/pki/admin.key")
API=https://127.0.0.1:$P_API
for _ in $(seq 120); do [ "$("${CURL[@]}" "$API/readyz" 2>/dev/null || true)" = ok ] && break; sleep 0.5; done
[ "$("${CURL[@]}" "$API/readyz")" = ok ] || fail "kube-apiserver /readyz: $("${CURL[@]}" "$API/readyz?verbose" || true)"
say "kube-apiserver /readyz: ok"
ver=$("${CURL[@]}" "$API/version")
echo "$ver"
echo "$ver" | grep -q "\"gitVersion\": \"$K8S_VERSION\"" || fail "/version does not say $K8S_VERSION"
[ "$(curl -s -o /dev/null -w '%{http_code}' --cacert "$D/pki/ca.crt" "$API/api/v1/namespaces")" = 403 ] \
  || fail "anonymous list of namespaces was not refused with 403 (system:anonymous, RBAC)"
"${CURL[@]}" -f "$API/api/v1/namespaces/default" >/dev/null || fail "admin GET namespace default"
say "/version says $K8S_VERSION; anonymous -> 403, admin cert -> 200"

if [ "$FULL" = 1 ]; then
  KC=(--kubeconfig="$D/admin.kubeconfig" --authentication-kubeconfig="$D/admin.kubeconfig"
      --authorization-kubeconfig="$D/admin.kubeconfig")
  "$BIN/kube-controller-manager" "${KC[@]}" --bind-address=127.0.0.1 --secure-port="$P_KCM" --leader-elect=false \
    --service-account-private-key-file="$D/pki/sa.key" --root-ca-file="$D/pki/ca.crt" \
    --use-service-account-credentials=true \
    --cluster-signing-cert-file="$D/pki/ca.crt" --cluster-signing-key-file="$D/pki/ca.key" \
    --node-monitor-grace-period=20s > "$D/kube-controller-manager.log" 2>&1 &
  PIDS+=($!)
  "$BIN/kube-scheduler" "${KC[@]}" --bind-address=127.0.0.1 --secure-port="$P_SCHED" --leader-elect=false \
    > "$D/kube-scheduler.log" 2>&1 &
  PIDS+=($!)
  S=$KWOK_STAGE_DIR
  "$BIN/kwok" --kubeconfig="$D/admin.kubeconfig" \
    --config="$S/node/fast/node-initialize.yaml" --config="$S/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml" \
    --config="$S/pod/fast/pod-ready.yaml" --config="$S/pod/fast/pod-complete.yaml" --config="$S/pod/fast/pod-delete.yaml" \
    --config="$S/pod/chaos/pod-container-running-failed.yaml" --config="$S/node/chaos/node-not-ready.yaml" \
    --manage-all-nodes=false --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
    --manage-nodes-with-label-selector= --manage-single-node= \
    --cidr=10.244.0.0/16 --node-ip=10.0.0.1 --node-lease-duration-seconds=40 \
    --server-address="127.0.0.1:$P_KWOK" > "$D/kwok.log" 2>&1 &
  PIDS+=($!)
  post() { "${CURL[@]}" -f -X POST -H 'Content-Type: application/yaml' --data-binary @- "$API$1" >/dev/null; }
  # default ServiceAccount appears once kcm runs; pods need it (ServiceAccount admission is on).
  for _ in $(seq 120); do "${CURL[@]}" -f "$API/api/v1/namespaces/default/serviceaccounts/default" >/dev/null 2>&1 && break; sleep 0.5; done
  "${CURL[@]}" -f "$API/api/v1/namespaces/default/serviceaccounts/default" >/dev/null || fail "kcm made no default ServiceAccount"
  say "kube-controller-manager created the default ServiceAccount"
  post /api/v1/nodes <<'EOF' || fail "create node"
apiVersion: v1
kind: Node
metadata:
  name: gpu-0
  annotations: {kwok.x-k8s.io/node: fake}
  labels: {type: kwok, kubernetes.io/hostname: gpu-0, nvidia.com/gpu.product: H100}
status:
  capacity:    {cpu: "96", memory: 1Ti, pods: "110", nvidia.com/gpu: "8"}
  allocatable: {cpu: "96", memory: 1Ti, pods: "110", nvidia.com/gpu: "8"}
EOF
  post /api/v1/namespaces/default/pods <<'EOF' || fail "create pod"
apiVersion: v1
kind: Pod
metadata: {name: smoke}
spec:
  containers:
  - name: c
    image: busybox
    resources: {limits: {nvidia.com/gpu: "8"}}
EOF
  phase=
  for _ in $(seq 120); do
    phase=$("${CURL[@]}" "$API/api/v1/namespaces/default/pods/smoke" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d.get("status",{}).get("phase",""), d["spec"].get("nodeName",""))')
    [ "${phase%% *}" = Running ] && break; sleep 0.5
  done
  [ "${phase%% *}" = Running ] || fail "pod not Running (phase/node: $phase)"
  say "pod scheduled by kube-scheduler and Running via kwok: $phase"
fi
say "PASS"
