"""A build request as the API takes it, the requirements it may hold, and its cache key.

The builder runs pip on the user's requirements.txt with the service's own rights, so a
request may only name packages: every line that would make pip read a file on the
builder's machine (`-r`, `-c`, `-e`, a path, `file:`), point it at another index
(`-i`, `--extra-index-url`, `--find-links`, `--trusted-host`) or expand the service's
environment (`${VAR}`) is refused with its line number. Index and wheelhouse are the
operator's choice (`builder.index_url`, `find_links`, `no_index`).
"""

from __future__ import annotations

import hashlib
import json
import re

from pydantic import BaseModel, ConfigDict, StrictStr

from .errors import RequestRefused

# Options pip accepts on a line of their own that change only how names are resolved.
GLOBAL_OPTIONS = frozenset({"--pre", "--prefer-binary", "--only-binary", "--no-binary", "--require-hashes"})
# Options pip accepts after a requirement on the same line.
REQUIREMENT_OPTIONS = frozenset({"--hash"})
URL_SCHEMES = ("https://", "http://", "git+https://")
# pip reads a bare name with one of these endings as an archive file on its own disk.
ARCHIVE_SUFFIXES = (
    ".whl",
    ".zip",
    ".tar",
    ".tar.gz",
    ".tgz",
    ".tar.bz2",
    ".tbz",
    ".tar.xz",
    ".txz",
    ".tar.lz",
)
# PEP 508 names; pip reads anything else at the start of a line as a path or a URL.
_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")
# What may follow a name: extras, a version, markers, a URL, or nothing.
_AFTER_NAME = re.compile(r"\s*(?:$|[\[(<>=!~;@,])")
_COMMENT = re.compile(r"(^|\s+)#.*$")


class BuildSpec(BaseModel):
    """`POST /api/v1/builds`: what to install, on what, for which package."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    requirements: StrictStr
    base: StrictStr | None = None
    package: StrictStr | None = None
    # The name of the caller's saved registry credentials (`paddlecloud registry`), for a
    # private base image.
    registry: StrictStr | None = None


def check_requirements(text: str, max_bytes: int) -> None:
    """Refuse requirements pip would read as more than package names (422 naming the line)."""
    size = len(text.encode(errors="surrogatepass"))
    if size > max_bytes:
        raise RequestRefused(f"is {size} bytes; at most {max_bytes} are accepted", field="requirements")
    if "\x00" in text:
        raise RequestRefused("must not contain NUL characters", field="requirements")
    if any(0xD800 <= ord(ch) <= 0xDFFF for ch in text):
        raise RequestRefused("is not valid UTF-8", field="requirements")
    for number, line in _logical_lines(text):
        problem = _line_problem(line)
        if problem is not None:
            shown = line if len(line) <= 80 else line[:80] + "…"
            raise RequestRefused(f"line {number} ({shown!r}): {problem}", field="requirements")


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first physical line number, text) of each line as pip reads it: continuations
    joined, comments and blank lines dropped."""
    result: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        if not pending:
            start = number
        if raw.endswith("\\"):
            pending += raw[:-1]
            continue
        line = _COMMENT.sub("", pending + raw).strip()
        pending = ""
        if line:
            result.append((start, line))
    if pending:
        line = _COMMENT.sub("", pending).strip()
        if line:
            result.append((start, line))
    return result


def _line_problem(line: str) -> str | None:
    if "${" in line:
        return "environment variables (${...}) are not expanded here; write the value"
    if "file:" in line.lower():
        return "file: URLs would install from the builder's own disk; name a package instead"
    # pip splits a line into the requirement and the options after it at the first
    # token that starts with a dash.
    tokens = line.split()
    split = next((i for i, t in enumerate(tokens) if t.startswith("-")), len(tokens))
    requirement, options = " ".join(tokens[:split]), tokens[split:]
    allowed = REQUIREMENT_OPTIONS if requirement else GLOBAL_OPTIONS
    for token in options:
        if not token.startswith("-"):
            continue  # the value of the option before it
        option = token.split("=", 1)[0]
        if option not in allowed:
            return _option_problem(option, bool(requirement))
    if not requirement:
        return None
    if requirement.lower().startswith(URL_SCHEMES):
        return None
    if "://" in requirement.split("@", 1)[0] or requirement.startswith(("git+", "hg+", "svn+", "bzr+")):
        return f"only {', '.join(URL_SCHEMES)} URLs may be installed from"
    match = _NAME.match(requirement)
    if match is None or not _AFTER_NAME.match(requirement, match.end()):
        return "not a package name, version or URL; paths on the builder's disk cannot be installed"
    if match.group().lower().endswith(ARCHIVE_SUFFIXES):
        return "names an archive file; files on the builder's disk cannot be installed (use an https URL)"
    if "@" in requirement:
        url = requirement.split("@", 1)[1].strip()
        if not url.lower().startswith(URL_SCHEMES):
            return f"a direct reference must be a {', '.join(URL_SCHEMES)} URL"
    return None


def _option_problem(option: str, after_requirement: bool) -> str:
    if option in ("-r", "--requirement", "-c", "--constraint", "-e", "--editable"):
        return f"{option} reads files or paths on the builder's machine; list the packages instead"
    if option in (
        "-i",
        "--index-url",
        "--extra-index-url",
        "-f",
        "--find-links",
        "--no-index",
        "--trusted-host",
    ):
        return f"{option}: where packages come from is the builder's configuration, not the request's"
    if after_requirement:
        return f"{option} is not accepted after a requirement (only --hash is)"
    return f"{option} is not accepted (only {', '.join(sorted(GLOBAL_OPTIONS))} are)"


def cache_key(base_identity: str, requirements: str, builder_version: str, owner: str | None = None) -> str:
    """sha256 of (the base image or Python, the requirements.txt text, the builder version,
    and the owner where each user's results are their own)."""
    fields = {"base": base_identity, "requirements": requirements, "builder": builder_version}
    if owner is not None:
        fields["owner"] = owner
    material = json.dumps(
        fields,
        sort_keys=True,
        ensure_ascii=False,
    )
    return hashlib.sha256(material.encode()).hexdigest()
