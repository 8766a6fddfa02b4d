{{- /*
The operator's RBAC rules, by purpose. No wildcards: every verb is one the operator calls
(tests/chart/test_rbac.py runs the operator against an in-memory API server and compares the
requests it made with these rules; the few rules it cannot exercise there are listed in that test
with the reason).

"kubedgx.rbac.namespaced": what the operator does inside a watched namespace; a ClusterRole when it
watches every namespace, a Role in each namespace of watchNamespaces otherwise.
"kubedgx.rbac.cluster": cluster-scoped objects; always a ClusterRole.
*/ -}}

{{- define "kubedgx.rbac.namespaced" -}}
# Application: DGXTrainingJobs are watched, read fresh before each reconcile, get the operator's
# finalizer (patch), and are deleted ttlSecondsAfterFinished after they end.
- apiGroups: ["kubedgx.io"]
  resources: ["dgxtrainingjobs"]
  verbs: ["get", "list", "watch", "patch", "delete"]
# Application: DGXDataMounts are watched, read by jobs and the webhook, and get the in-use finalizer.
- apiGroups: ["kubedgx.io"]
  resources: ["dgxdatamounts"]
  verbs: ["get", "list", "watch", "patch"]
# Application and admission: a namespace's guard rails (DGXLimits "default") are read by the webhook at
# each create or change of a job, and by the operator at a job's first pass (its defaults).
- apiGroups: ["kubedgx.io"]
  resources: ["dgxlimits"]
  verbs: ["get"]
# Application: phase, conditions, progress and listings are written to the status subresources.
- apiGroups: ["kubedgx.io"]
  resources: ["dgxtrainingjobs/status", "dgxdatamounts/status"]
  verbs: ["patch"]
# Application and admission: DGXBudgets are watched (a change releases held jobs) and read before a run
# starts; the webhook lists a namespace's budgets (and then its jobs) at each create or change of a job,
# to warn when its run cannot fit one.
- apiGroups: ["kubedgx.io"]
  resources: ["dgxbudgets"]
  verbs: ["get", "list", "watch"]
# Application: a budget's status is its ledger: spend settled, reservations of runs in progress (a patch
# guarded by the budget's resourceVersion, so two starts cannot both take the last room).
- apiGroups: ["kubedgx.io"]
  resources: ["dgxbudgets/status"]
  verbs: ["patch"]
# Application: children carry ownerReferences with blockOwnerDeletion, which the
# OwnerReferencesPermissionEnforcement admission plugin allows only to who may update the owner's finalizers.
- apiGroups: ["kubedgx.io"]
  resources: ["dgxtrainingjobs/finalizers"]
  verbs: ["update"]
# Application: worker pods are created, watched (kopf index by job), read when a create meets a
# 409 (whose is it?), deleted on restarts, scale-down, suspend, deadlines and job deletion, and
# relabelled (patch) when stuck Terminating on a lost node, so they leave the job's Service.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "create", "delete", "patch"]
# Application: a running job's worker 0 log is read (at most once per progressInterval) for its
# latest progress line, so training pods need no write access to report their progress.
- apiGroups: [""]
  resources: ["pods/log"]
  verbs: ["get"]
# Application: each job's headless Service and trainer ConfigMap; they go with the job (ownerReferences).
# Admission: the webhook's dry-run of a new job's ConfigMap, Service and worker 0 (dryRun=All) is a
# create of each, under this rule and the pods rule above; nothing more is needed.
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "list", "watch", "create"]
# Application: trainer ConfigMaps are named by content; one an edit superseded is deleted once no
# worker mounts it.
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list", "watch", "create", "delete"]
{{- if .Values.dataMounts.readSecrets }}
# Application: a DGXDataMount's credentialsSecretRef is read to list its store (dataMounts.readSecrets).
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get"]
{{- end }}
# kopf framework: Events on jobs and mounts (phase changes, restarts, failures).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- if .Values.kueue.enabled }}
# Kueue integration (kueue.enabled): each queued job's Workload is created, watched, deactivated or
# moved to another queue (patch) and recreated when the job changes shape (delete); its status says
# when an evicted job has stopped and when the job ended (workloads/status).
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads"]
  verbs: ["list", "watch", "create", "delete", "patch"]
# Kueue integration: Workload status (an evicted job stopped: reservation cleared; the job ended: Finished).
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads/status"]
  verbs: ["patch"]
{{- end }}
{{- if and .Values.peering.enabled .Values.watchNamespaces }}
# kopf framework (peering.enabled): the KopfPeering object of each watched namespace.
- apiGroups: ["kopf.dev"]
  resources: ["kopfpeerings"]
  verbs: ["get", "list", "watch", "patch"]
{{- end }}
{{- end }}

{{- define "kubedgx.rbac.cluster" -}}
# kopf framework: resource discovery, watching CustomResourceDefinitions come and go.
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["list", "watch"]
{{- if .Values.kueue.enabled }}
# Kueue integration: the admitted ResourceFlavors' node labels and tolerations go onto the workers;
# a Workload carries the value of the job's WorkloadPriorityClass or of its workers' PriorityClass.
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["resourceflavors"]
  verbs: ["list", "watch"]
# Kueue integration: the value of a job's WorkloadPriorityClass (label kueue.x-k8s.io/priority-class).
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloadpriorityclasses"]
  verbs: ["get"]
{{- end }}
{{- if .Values.priorityClasses.enabled }}
{{- $p := .Values.priorityClasses }}
# The workers' PriorityClasses (those three, by name): checked at startup, so a missing one is dropped with a
# warning instead of every worker being refused (dgx_operator/runtime/priorities.py); with kueue.enabled, their value
# goes into a queued job's Workload.
- apiGroups: ["scheduling.k8s.io"]
  resources: ["priorityclasses"]
  resourceNames: [{{ $p.low.name | quote }}, {{ $p.normal.name | quote }}, {{ $p.high.name | quote }}]
  verbs: ["get"]
{{- end }}
{{- if .Values.watchNamespaces }}
# kopf framework: which of the watched namespaces exist (kopf lists and watches namespaces
# whenever it is not cluster-wide).
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["list", "watch"]
{{- end }}
{{- if include "kubedgx.selfSignedWebhook" . }}
# Admission (self-signed webhook): the chart renders the ValidatingWebhookConfiguration; the replicas
# read it and set the shared CA as its caBundle (a patch of that field only). That one object, and
# no create: the release owns it.
- apiGroups: ["admissionregistration.k8s.io"]
  resources: ["validatingwebhookconfigurations"]
  resourceNames: [{{ include "kubedgx.webhookConfigurationName" . | quote }}]
  verbs: ["get", "patch"]
{{- end }}
{{- if and .Values.peering.enabled (not .Values.watchNamespaces) }}
# kopf framework (peering.enabled): the ClusterKopfPeering object shared with other kopf operators.
- apiGroups: ["kopf.dev"]
  resources: ["clusterkopfpeerings"]
  verbs: ["get", "list", "watch", "patch"]
{{- end }}
{{- end }}


{{- /*
"kubedgx.rbac.release": objects in the release's own namespace; a Role there.
*/ -}}
{{- define "kubedgx.rbac.release" -}}
{{- if .Values.leaderElection.enabled }}
# Leader election: the replicas read and write the Lease they elect on, which the chart renders
# (templates/leader.yaml): that one, by name, and no create.
- apiGroups: ["coordination.k8s.io"]
  resources: ["leases"]
  resourceNames: [{{ include "kubedgx.leaseName" . | quote }}]
  verbs: ["get", "update"]
{{- end }}
{{- if include "kubedgx.selfSignedWebhook" . }}
# Admission (self-signed webhook): the Secret the replicas share the serving pair in, rendered empty
# by the chart; the first replica fills it, any renews it (patch guarded by its resourceVersion).
- apiGroups: [""]
  resources: ["secrets"]
  resourceNames: [{{ include "kubedgx.certificateSecretName" . | quote }}]
  verbs: ["get", "patch"]
{{- end }}
{{- end }}
