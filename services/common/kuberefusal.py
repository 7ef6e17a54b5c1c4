"""What a Warning Event about pods that Kubernetes did not create means, in words."""

from __future__ import annotations

import re
from dataclasses import dataclass

# The Job and StatefulSet controllers' reason when the API server refuses a pod they make.
CREATE_FAILED = "FailedCreate"
VOLUME_FAILED = ("FailedMount", "FailedAttachVolume")
_LIMIT_RANGE = re.compile(r"(maximum|minimum) \S+ usage per (Container|Pod)|limit to request ratio per")
_DENIED = re.compile(r'admission webhook ".*" denied the request|ValidatingAdmissionPolicy .* denied request')


@dataclass(frozen=True)
class Refusal:
    """Kubernetes refusing pods, or a pod's volume, as a Warning Event says, in words.
    `lasting`: waiting does not change it (an admission check of the pods' spec against
    a namespace's fixed rules), so what waits for the pods fails; else it may pass (the
    quota frees, the ServiceAccount is made, the volume mounts) and it waits."""

    message: str
    lasting: bool = False


def refusal_in(reason: str, message: str, pods: str = "its pods") -> Refusal:
    """What a Warning Event about `pods`' owner means, in words. Lasting: Pod Security, a
    LimitRange's bound, an admission webhook's or ValidatingAdmissionPolicy's denial (each
    judges the pods' spec against the namespace's rules, and neither changes while one
    waits). Waiting: the quota, a ServiceAccount not yet made in a new namespace, a volume
    that does not mount (yet), and any refusal not known here (a webhook that does not
    answer, say): they may pass by themselves."""
    if reason in VOLUME_FAILED:
        return Refusal(f"a volume of {pods} does not mount: {message}")
    if "violates PodSecurity" in message:
        return Refusal(f"Kubernetes refuses {pods} (Pod Security admission): {message}", lasting=True)
    if _LIMIT_RANGE.search(message):
        return Refusal(f"the namespace's LimitRange refuses {pods}: {message}", lasting=True)
    if _DENIED.search(message):
        return Refusal(f"an admission policy refuses {pods}: {message}", lasting=True)
    if "quota" in message:
        return Refusal(f"the namespace's quota refuses {pods}: {message}")
    if "error looking up service account" in message:
        return Refusal(f"{pods} wait for the namespace's ServiceAccount to be made: {message}")
    return Refusal(f"Kubernetes does not create {pods}: {message}")
