"""What placing a job package tells its caller as it goes (`AsyncClient.place_package`).

A module of its own, so that the CLI's `submit`, which subclasses it, imports neither the
client (aiohttp) nor the packing (tarfile, pathspec) at start-up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .package import Package
    from .progress import Progress


class SubmitSteps:
    """What placing a job package tells its caller as it goes; this base says nothing.

    `place_package` calls `remote` for a PFS path; for a local one `packed` once it is packed,
    then `found` (PFS holds it), `would_upload` (no upload asked for) or `uploading`, whose
    answer is the progress the upload shows (`progress`, given here, by default).
    """

    def __init__(self, progress: Progress | None = None) -> None:
        self.progress = progress

    def remote(self, path: str) -> None:
        """The package is already on PFS, at `path`."""

    def packed(self, pkg: Package, source: str) -> None:
        """The local `source` was packed (or an archive taken as it is) into `pkg`."""

    def found(self, path: str) -> None:
        """PFS already holds that exact package, at `path`."""

    def would_upload(self, pkg: Package, path: str) -> None:
        """The package is not on PFS, and no upload was asked for; it would go to `path`."""

    def uploading(self, pkg: Package, path: str) -> Progress | None:
        """The package is about to be uploaded to `path`; returns the progress to show."""
        return self.progress
