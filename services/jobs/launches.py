"""A job's PFS paths, resolved once as its owner will use them, and the launch built from them.

A submit resolves the package, output and input paths here, once each; the launch carries
the parsed `PfsPath`s to the backend, which takes them as they are. A job read again after
a restart of the service is resolved the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

from paddlecloud.common import errors
from paddlecloud.common.errors import Invalid
from paddlecloud.common.internal_auth import Identity
from paddlecloud.common.volume import PfsPath, resolve_for

from .backend import Launch
from .records import JobRecord
from .spec import JobSpec

# Said to an admin whose own rights reached a path their job's cannot.
_ADMIN_NOTE = (
    "; a job reads and writes PFS with its owner's rights, an admin's too: copy what it needs into your home"
)


def home(datacenter: str, user: str) -> str:
    return f"/pfs/{datacenter}/home/{user}"


def output_text(spec: JobSpec, datacenter: str, owner: str) -> str:
    """Where the job writes its output: the spec's, or `jobs/<name>/output` in the owner's home."""
    return spec.output or f"{home(datacenter, owner)}/jobs/{spec.name}/output"


@dataclass(frozen=True)
class JobPaths:
    """A job's paths, parsed and checked to be its owner's to read (package, input) and to write (output)."""

    package: PfsPath
    output: PfsPath
    input: PfsPath | None

    @classmethod
    def resolve(cls, identity: Identity, spec: JobSpec, datacenter: str) -> JobPaths:
        """The paths of `identity`'s job, checked as the job will use them: with its owner's
        rights, never an admin's (an admin is told why their own rights do not reach).
        Invalid names the spec's field at fault."""
        owner = Identity(identity.user)

        def one(field: str, text: str, *, write: bool) -> PfsPath:
            try:
                return resolve_for(owner, text, datacenter, write=write)
            except errors.ProblemError as exc:  # the path grammar's refusal, shown as this field's
                note = _ADMIN_NOTE if identity.admin else ""
                raise Invalid(exc.detail + note, field=field) from None

        return cls(
            package=one("package", spec.package, write=False),
            output=one("output", output_text(spec, datacenter, identity.user), write=True),
            input=None if spec.input is None else one("input", spec.input, write=False),
        )


def launch_of(job: JobRecord, paths: JobPaths, package_kind: str, datacenter: str) -> Launch:
    """What the backend needs to run `job`, its paths resolved already."""
    return Launch(
        job=job,
        spec=job.spec,
        datacenter=datacenter,
        pfs_home=home(datacenter, job.owner),
        output=paths.output,
        package=paths.package,
        package_kind=package_kind,
        input=paths.input,
    )
