"""The SDK that every job's Python can import (`paddlecloud.metrics`), as files a backend puts in the job.

On one machine nothing needs to be added: a job runs the platform's own Python, or an
environment the builder made over it (its `.pth` appends the platform's site-packages),
and the sandbox binds the platform's packages read-only, so `import paddlecloud.metrics`
(and `paddlecloud.runtime`) already works there. On Kubernetes a job's image need not
have `paddlecloud` installed: the backend carries `files()` in the job's own ConfigMap,
mounts them read-only at `SDK_DIR`, and appends `SDK_DIR` to the worker's PYTHONPATH in
the shell that runs its entry (`pythonpath_prefix`), after whatever PYTHONPATH the image
or the user's `env` set, so that a user's own `paddlecloud` wins and nothing of theirs
is replaced. PYTHONPATH is not reserved: a job may set it.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

# Where a pod sees the SDK directory; `paddlecloud/` is inside it.
SDK_DIR = "/opt/paddlecloud/sdk"
# The files, by their path below SDK_DIR.
INIT = "paddlecloud/__init__.py"
METRICS = "paddlecloud/metrics.py"


@functools.cache
def files() -> dict[str, str]:
    """The SDK's files by their path below SDK_DIR: a `paddlecloud/__init__.py` that defers to
    an installed paddlecloud (sdk_shim.py) and the platform's own `paddlecloud.metrics`."""
    spec = importlib.util.find_spec("paddlecloud.metrics")
    if spec is None or spec.origin is None:
        raise RuntimeError("paddlecloud.metrics is not installed with the jobs service")
    return {
        INIT: Path(__file__).with_name("sdk_shim.py").read_text(encoding="utf-8"),
        METRICS: Path(spec.origin).read_text(encoding="utf-8"),
    }


def pythonpath_prefix() -> str:
    """The shell line that appends SDK_DIR to PYTHONPATH, keeping what was there first."""
    return f'export PYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}{SDK_DIR}"\n'
