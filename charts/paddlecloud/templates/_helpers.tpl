{{/* Names, labels and the pieces every workload shares. */}}

{{- define "paddlecloud.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* <release>-paddlecloud, short enough that <fullname>-<part> stays a DNS label. */}}
{{- define "paddlecloud.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- /* The jobs service's Lease (leader election), in the release's namespace. */ -}}
{{- define "paddlecloud.leaseName" -}}
{{- printf "%s-jobs-leader" (include "paddlecloud.fullname" .) -}}
{{- end -}}

{{- define "paddlecloud.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "paddlecloud.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector labels of one component: (dict "root" $ "component" "gateway"). */}}
{{- define "paddlecloud.selectorLabels" -}}
app.kubernetes.io/name: {{ include "paddlecloud.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "paddlecloud.componentLabels" -}}
{{ include "paddlecloud.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "paddlecloud.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* Where the configuration and the secret files are mounted in every service. */}}
{{- define "paddlecloud.configPath" -}}/etc/paddlecloud/paddlecloud.yaml{{- end -}}
{{- define "paddlecloud.secretsDir" -}}/etc/paddlecloud/secrets{{- end -}}
{{- define "paddlecloud.pushAuthFile" -}}/etc/paddlecloud/registry/config.json{{- end -}}
{{- define "paddlecloud.pfsRoot" -}}/pfs/{{ .Values.storage.datacenter }}{{- end -}}
{{- define "paddlecloud.sqliteDir" -}}/var/lib/paddlecloud/store{{- end -}}

{{/* Each service's port (the configuration's defaults). */}}
{{- define "paddlecloud.port" -}}
{{- get (dict "gateway" 8080 "jobs" 8081 "pfs" 8082 "builder" 8083) . -}}
{{- end -}}

{{- define "paddlecloud.serviceUrl" -}}
{{- printf "http://%s-%s:%v" (include "paddlecloud.fullname" .root) .component (include "paddlecloud.port" .component) -}}
{{- end -}}

{{/* The Secrets and keys each secret file comes from: generated ones live in <fullname>,
     an operator's in the Secret they named. */}}
{{- define "paddlecloud.internalSecretRef" -}}
{{- if .Values.internalSecret.existingSecret -}}
{{ .Values.internalSecret.existingSecret }}/internal-secret
{{- else -}}
{{ include "paddlecloud.fullname" . }}/internal-secret
{{- end -}}
{{- end -}}

{{- define "paddlecloud.adminPasswordRef" -}}
{{- if .Values.admin.existingSecret -}}
{{ .Values.admin.existingSecret }}/admin-password
{{- else -}}
{{ include "paddlecloud.fullname" . }}/admin-password
{{- end -}}
{{- end -}}

{{- define "paddlecloud.storeUrlRef" -}}
{{- if and (eq .Values.store.type "mongodb") .Values.mongodb.enabled .Values.mongodb.existingSecret -}}
{{ .Values.mongodb.existingSecret }}/mongodb-uri
{{- else if and (eq .Values.store.type "mongodb") (not .Values.mongodb.enabled) .Values.store.external.existingSecret -}}
{{ .Values.store.external.existingSecret }}/mongodb-uri
{{- else -}}
{{ include "paddlecloud.fullname" . }}/store-url
{{- end -}}
{{- end -}}

{{/* Whether the builder pushes with credentials (a file it reads at start). */}}
{{- define "paddlecloud.pushAuth" -}}
{{- if and (eq .Values.builder.backend "kaniko") (or .Values.builder.kaniko.push.existingSecret .Values.builder.kaniko.push.username) -}}true{{- end -}}
{{- end -}}

{{- define "paddlecloud.pushSecretName" -}}
{{- default (printf "%s-registry" (include "paddlecloud.fullname" .)) .Values.builder.kaniko.push.existingSecret -}}
{{- end -}}

{{/* A projected volume item: (dict "ref" "secret/key" "path" "file"). */}}
{{- define "paddlecloud.secretSource" -}}
- secret:
    name: {{ first (splitList "/" .ref) }}
    items:
      - key: {{ last (splitList "/" .ref) }}
        path: {{ .path }}
{{- end -}}

{{/* A container's security context: what Pod Security's restricted level asks, and a
     read-only root filesystem. */}}
{{- define "paddlecloud.containerSecurityContext" -}}
allowPrivilegeEscalation: false
privileged: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* The datacenter's PFS volume as pfs mounts it: the same source job pods get from
     jobs.kubernetes.datacenters (services/jobs/kube/manifests.py), whole. */}}
{{- define "paddlecloud.pfsVolume" -}}
{{- $s := .Values.storage -}}
{{- if eq $s.kind "cephfs" -}}
persistentVolumeClaim:
  claimName: {{ include "paddlecloud.pfsClaim" . }}
{{- else if eq $s.kind "pvc" -}}
persistentVolumeClaim:
  claimName: {{ $s.claimName }}
{{- else -}}
hostPath:
  path: {{ $s.hostPath }}
  # A node without the PFS mounted fails the pod rather than giving it an empty one.
  type: Directory
{{- end -}}
{{- end -}}

{{/* storage.kind cephfs: pfs's claim (in the release's namespace) and its static
     PersistentVolume (cluster-wide: named after the release's namespace too). */}}
{{- define "paddlecloud.pfsClaim" -}}{{ include "paddlecloud.fullname" . }}-pfs{{- end -}}
{{- define "paddlecloud.pfsPersistentVolume" -}}{{ .Release.Namespace }}-{{ include "paddlecloud.fullname" . }}-pfs{{- end -}}

{{/* The in-tree cephfs values, refused with the message the service's settings give. */}}
{{- define "paddlecloud.checkStorage" -}}
{{- $s := .Values.storage -}}
{{- $old := list -}}
{{- range $key := list "monitors" "path" "user" "secretName" -}}
{{- if hasKey $s $key -}}{{- $old = append $old $key -}}{{- end -}}
{{- end -}}
{{- if and (eq $s.kind "cephfs") (eq .Values.jobs.kubernetes.namespaceMode "shared") -}}
{{- fail "storage.kind cephfs needs jobs.kubernetes.namespaceMode per-user (the jobs service makes each user's PersistentVolumes, which shared mode has no right to)" -}}
{{- end -}}
{{- if and $old (eq $s.kind "cephfs") -}}
{{- fail (printf "storage.kind cephfs now means the ceph-csi driver (cephfs.csi.ceph.com); the in-tree cephfs volume was removed in Kubernetes 1.31: give storage.clusterID, fsName, rootPath and nodeStageSecretName/nodeStageSecretNamespace (the Secret with userID and userKey) instead of storage.%s (docs/kubernetes.md, \"CephFS through ceph-csi\")" (join ", " $old)) -}}
{{- end -}}
{{- end -}}

{{/*
Which installation the jobs service is (jobs.kubernetes.release), and the label value
every object it makes carries (paddlecloud.org/release), as services/jobs/kube/names.py's
release_label computes it: the value itself up to 63 characters, else its first 54, "-"
and 8 hex of its sha256.
*/}}
{{- define "paddlecloud.release" -}}
{{- printf "%s.%s" .Release.Namespace .Release.Name -}}
{{- end -}}
{{- define "paddlecloud.releaseLabel" -}}
{{- $release := include "paddlecloud.release" . -}}
{{- if le (len $release) 63 -}}
{{- $release -}}
{{- else -}}
{{- printf "%s-%s" (trunc 54 $release | trimAll "-.") (sha256sum $release | trunc 8) -}}
{{- end -}}
{{- end -}}

{{/* Cluster-scoped names carry the release's namespace: two releases of one name may coexist. */}}
{{- define "paddlecloud.jobsClusterName" -}}
{{- printf "%s-%s-jobs" .Release.Namespace (include "paddlecloud.fullname" .) -}}
{{- end -}}
{{- define "paddlecloud.tenantRole" -}}
{{- printf "%s-tenant" (include "paddlecloud.jobsClusterName" .) -}}
{{- end -}}
