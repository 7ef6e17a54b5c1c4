"""The SDK directory's `paddlecloud/__init__.py` in a job's pods: `import paddlecloud.metrics` anywhere.

On Kubernetes a job's image need not have the platform installed (a Paddle or PyTorch
image, the user's own). The jobs service mounts a read-only directory holding this file as
`paddlecloud/__init__.py` and `paddlecloud/metrics.py` (cli/metrics.py, standard library
only) and appends it to the worker's PYTHONPATH (services/jobs/sdk.py). PYTHONPATH comes
before site-packages on `sys.path`, so in an image that does have `paddlecloud` installed
(the platform's runtime image: `paddlecloud.runtime`, `paddlecloud.dataset`...) this
package would hide that one. It does not: when another `paddlecloud` is found further
along `sys.path`, that one is loaded in this one's place (a module may replace itself in
`sys.modules` while it is imported; the import system returns what is there at the end),
and only this directory is added to the end of its `__path__`, so `paddlecloud.metrics` is
found even where the installed copy predates it. A user's own `paddlecloud` on their own
PYTHONPATH comes first and is not touched.

Everything happens only when this file is imported as `paddlecloud`: the platform's own
copy of it (`paddlecloud.jobs.sdk_shim`) is inert, read as text by the jobs service.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys


def _installed(name: str, here: str) -> importlib.machinery.ModuleSpec | None:
    """Another package `name` on sys.path, not this directory's, or None."""
    parent = os.path.realpath(os.path.dirname(here))
    path = [entry for entry in sys.path if os.path.realpath(entry or ".") != parent]
    spec = importlib.machinery.PathFinder.find_spec(name, path)
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        return None
    return spec


def _become_installed(name: str, here: str) -> None:
    spec = _installed(name, here)
    if spec is None:
        return
    module = importlib.util.module_from_spec(spec)
    module.__path__.append(here)
    mine = sys.modules[name]
    # In sys.modules before it runs: its own relative imports must find it, not this one.
    sys.modules[name] = module
    try:
        assert spec.loader is not None
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules[name] = mine
        raise


if __name__ == "paddlecloud":
    _become_installed(__name__, os.path.dirname(os.path.abspath(__file__)))
