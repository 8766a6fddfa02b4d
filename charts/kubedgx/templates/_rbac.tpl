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
# Application: phase, conditions, progress and listings are written to the status subresources.
- apiGroups: ["kubedgx.io"]
  resources: ["dgxtrainingjobs/status", "dgxdatamounts/status"]
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
# Kueue integration: the value of the workers' PriorityClass, for a job without that label.
- apiGroups: ["scheduling.k8s.io"]
  resources: ["priorityclasses"]
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
# Admission (self-signed webhook): at each start the operator creates its ValidatingWebhookConfiguration
# with the new CA (create cannot be limited to a name: RBAC checks it before the object has one) ...
- apiGroups: ["admissionregistration.k8s.io"]
  resources: ["validatingwebhookconfigurations"]
  verbs: ["create"]
# Admission (self-signed webhook): ... or, when it exists (409), merge-patches its webhooks and caBundle;
# only that one object.
- apiGroups: ["admissionregistration.k8s.io"]
  resources: ["validatingwebhookconfigurations"]
  resourceNames: [{{ include "kubedgx.webhookConfigurationName" . | quote }}]
  verbs: ["patch"]
# Admission (self-signed webhook): the UID of this ClusterRole, made the configuration's owner so that
# uninstalling the release garbage-collects the configuration with it.
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["clusterroles"]
  resourceNames: [{{ include "kubedgx.operatorName" . | quote }}]
  verbs: ["get"]
{{- end }}
{{- if and .Values.peering.enabled (not .Values.watchNamespaces) }}
# kopf framework (peering.enabled): the ClusterKopfPeering object shared with other kopf operators.
- apiGroups: ["kopf.dev"]
  resources: ["clusterkopfpeerings"]
  verbs: ["get", "list", "watch", "patch"]
{{- end }}
{{- end }}
