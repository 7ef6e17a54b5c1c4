"""Names and labels of everything the kubernetes backend creates, in one place.

A user's namespace is `<prefix><user>`. The users API admits only names that are DNS
labels of at most 32 characters (store.models.USER_NAME; e-mail addresses are refused,
docs/api.md says why) and the prefix is at most 20, so every user's namespace and label
keep the name's spelling. Any other text given here (a store written by hand) is made
DNS-1123 with an 8-hex sha256 suffix rather than refused, so that two names that spell
the same after cleaning never meet in one namespace. The rule needs no lookup, so a
restarted service finds the same names.

A job's objects (spec.py explains the length budget of a job name, 44 characters):
- `<job>`: the ConfigMap that owns the rest (deleting it removes them all);
- `<job>-pserver`: the parameter servers' StatefulSet and headless Service;
- `<job>-trainer`: the trainers' Indexed Job and headless Service (pods `<job>-trainer-<i>`);
- `<job>-registry`: the job's `kubernetes.io/dockerconfigjson` Secret, with `-registry`;
- `<job>`: the NetworkPolicy that lets the job's pods talk to each other.

A job's viewer (docs/metrics.md §4.5), `<job>-tensorboard` or `<job>-visualdl`: a
ConfigMap (the launcher's source) that owns its Pod, Service and NetworkPolicy of the same
name. They carry LABEL_VIEWER_OF (the job's id), never LABEL_JOB_ID: the job's own
NetworkPolicy selects pods by that label (a viewer must not reach the job's pods), the
backend reads pods with it as workers, and a finished job's objects go while its viewer
is still wanted.

A user's namespace holds, besides, the tenancy objects named below. The NetworkPolicies'
names are longer than any job name may be (spec.MAX_NAME_LENGTH), so no job's policy can
ever take the place of the namespace's own (a shared namespace holds every user's jobs).
"""

from __future__ import annotations

import hashlib
import re

MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "paddlecloud"
# Which installation made it (release_label of `jobs.kubernetes.release`): a service
# watches, adopts, sweeps and deletes only what carries its own.
LABEL_RELEASE = "paddlecloud.org/release"
LABEL_USER = "paddlecloud.org/user"  # user_label(): a label-safe form of the name
LABEL_JOB = "paddlecloud.org/job"  # the job's name
LABEL_JOB_ID = "paddlecloud.org/job-id"  # the store's id: tells a resubmitted name apart
LABEL_ROLE = "paddlecloud.org/role"  # pserver | trainer
ANNOTATION_USER = "paddlecloud.org/user-name"  # the user's name exactly
# LABEL_ROLE's values: a parameter server's or a trainer's objects, or the job's as a
# whole (its owner ConfigMap, registry Secret and NetworkPolicy).
ROLE_PSERVER = "pserver"
ROLE_TRAINER = "trainer"
ROLE_JOB = "job"
ROLE_VIEWER = "viewer"
LABEL_VIEWER_OF = "paddlecloud.org/viewer-of"  # the store's id of the job a viewer shows
LABEL_VIEWER = "paddlecloud.org/viewer"  # tensorboard | visualdl
# The tenancy objects of a namespace (manifests.tenancy_objects).
QUOTA_NAME = "paddlecloud-quota"
LIMIT_RANGE_NAME = "paddlecloud-limits"
DENY_ALL_POLICY = "paddlecloud-namespace-deny-all-ingress-and-egress"
DNS_STORAGE_POLICY = "paddlecloud-namespace-allow-egress-to-dns-and-storage"
# Kubernetes' own: the trainer id of an Indexed Job's pod, the index of a StatefulSet's.
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
POD_INDEX = "apps.kubernetes.io/pod-index"
# How many pods of the index failed before this one (set with backoffLimitPerIndex).
INDEX_FAILURES = "batch.kubernetes.io/job-index-failure-count"

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
MAX_LABEL = 63
# The RoleBinding the service makes in each namespace it owns (per-user mode), to the
# tenant ClusterRole, for its own ServiceAccount.
TENANT_BINDING = "paddlecloud-jobs"


def _suffix(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def _label(prefix: str, name: str) -> str:
    """`prefix + name` as a DNS-1123 label; cleaned names get a hash suffix."""
    whole = prefix + name
    if _DNS_LABEL.match(whole) and len(whole) <= MAX_LABEL:
        return whole
    cleaned = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    room = MAX_LABEL - len(prefix) - 9  # "-" and 8 hex
    body = cleaned[:room].rstrip("-")
    return f"{prefix}{body}-{_suffix(name)}" if body else f"{prefix}{_suffix(name)}"


def namespace_for(user: str, prefix: str) -> str:
    """The namespace of `user` in per-user mode."""
    return _label(prefix, user)


def user_label(user: str) -> str:
    """The value of LABEL_USER for `user`: a label value, unique per user name."""
    return _label("", user)


def owner_name(job: str) -> str:
    return job


def pserver_name(job: str) -> str:
    return f"{job}-pserver"


def trainer_name(job: str) -> str:
    return f"{job}-trainer"


def registry_secret_name(job: str) -> str:
    return f"{job}-registry"


def viewer_name(job: str, kind: str) -> str:
    """A job's viewer's objects: at most 44 + 12 characters, a DNS label."""
    return f"{job}-{kind}"


def release_label(release: str) -> str:
    """The value of LABEL_RELEASE for the setting `release`: itself when it is a label
    value, else its first 54 characters cleaned, `-` and 8 hex of its sha256 (the chart's
    `paddlecloud.releaseLabel` computes the same for "<namespace>.<name>")."""
    if _LABEL_VALUE.match(release) and len(release) <= MAX_LABEL:
        return release
    body = re.sub(r"[^A-Za-z0-9._-]+", "-", release)[:54].strip("-._")
    return f"{body}-{_suffix(release)}" if body else _suffix(release)


def managed_labels(release: str) -> dict[str, str]:
    """The labels every object of this installation carries."""
    return {MANAGED_BY: MANAGER, LABEL_RELEASE: release_label(release)}


def job_labels(user: str, job: str, job_id: str, release: str) -> dict[str, str]:
    return managed_labels(release) | {LABEL_USER: user_label(user), LABEL_JOB: job, LABEL_JOB_ID: job_id}


def managed_selector(release: str) -> str:
    """The label selector of every object this installation's backend made."""
    return f"{MANAGED_BY}={MANAGER},{LABEL_RELEASE}={release_label(release)}"


def is_ours(obj: dict[str, object], release: str) -> bool:
    """Whether `obj` (a namespace, a job's owner) was made by this installation."""
    meta = obj.get("metadata")
    labels = (meta.get("labels") if isinstance(meta, dict) else None) or {}
    return isinstance(labels, dict) and labels.get(LABEL_RELEASE) == release_label(release)


# The two PFS areas a user's job pods mount, each from a volume of its own with kind
# cephfs: the user's home read-write, public read-only.
PFS_AREAS = ("home", "public")


def volume_name(release: str, datacenter: str, user: str, area: str) -> str:
    """The PersistentVolume (cluster-wide) over `user`'s `area` on `datacenter`, made by
    the installation `release`: the hash of all four keeps it apart from every other
    user's, datacenter's and installation's. Also its ceph-csi volumeHandle."""
    return _label("pfs-", f"{datacenter}/{user}/{area}/{release}")


def claim_name(datacenter: str, user: str, area: str) -> str:
    """The claim of that volume in the user's namespace (a user's own in shared mode too)."""
    return _label("pfs-", f"{datacenter}/{user}/{area}")
