"""images/images.txt, the one list of the images the chart pulls that `make images` builds or
copies, against charts/paddlecloud/values.yaml: an image the chart gains without a line in
the list (which `make images` would then leave out of the admin's registry) fails here."""

from __future__ import annotations

import functools
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
VALUES = REPO / "charts" / "paddlecloud" / "values.yaml"


@functools.cache
def images_module() -> ModuleType:
    """images/images.py, which `make images` runs as a script (images/ is no package)."""
    spec = importlib.util.spec_from_file_location("make_images", REPO / "images" / "images.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def chart_images(values: Any, path: str = "") -> dict[str, str]:
    """Every image values.yaml sets, by dotted key: keys named `image` ({repository, tag})
    or ending in `Image`, left out where empty (gpuImage: none unless set)."""
    found: dict[str, str] = {}
    if not isinstance(values, dict):
        return found
    for key, value in values.items():
        dotted = f"{path}.{key}" if path else key
        if key == "image" and isinstance(value, dict):
            found[dotted] = f"{value['repository']}:{value['tag']}" if value["tag"] else value["repository"]
        elif key.endswith("Image") and isinstance(value, str):
            if value:
                found[dotted] = value
        else:
            found.update(chart_images(value, dotted))
    return found


def test_every_image_of_the_chart_is_in_the_list_with_the_charts_default() -> None:
    images = images_module()
    values = yaml.safe_load(VALUES.read_text())
    chart = chart_images(values)
    listed = {entry.key: entry for entry in images.entries()}
    assert set(chart) - set(listed) == set(), "images the chart pulls that images/images.txt lacks"
    for key, default in chart.items():
        entry = listed[key]
        if entry.how == "copy":
            assert entry.origin == default, (
                f"{key}: the list copies {entry.origin}, the chart pulls {default}"
            )
        else:
            repository, tag, _ = images.split_reference(default)
            assert repository == f"paddlecloud/{entry.name}", (key, default)
            assert tag in ("", images.version()), f"{key}: {default} is not this version's build"
    # A key the chart does not have yet may only be an image this repository builds (its
    # Dockerfile is here before the chart names it); a copied image always matches the chart.
    for key, entry in listed.items():
        assert key in chart or entry.how == "build", f"images/images.txt copies {key}, which the chart lacks"
        if entry.how == "build":
            assert (REPO / entry.origin).is_file(), entry.origin


def test_references_split_into_repository_tag_and_digest() -> None:
    split = images_module().split_reference
    assert split("mongo:8.0") == ("mongo", "8.0", "")
    assert split("127.0.0.1:5000/lab/kaniko:v1@sha256:ab") == ("127.0.0.1:5000/lab/kaniko", "v1", "sha256:ab")
    assert split("registry:5000/python") == ("registry:5000/python", "", "")


def test_a_registry_given_as_a_url_is_refused_in_one_line() -> None:
    """`make images REGISTRY=http://...` stops before building, naming the setting."""
    done = subprocess.run(
        [sys.executable, str(REPO / "images" / "images.py")],
        env={"PATH": "/usr/bin:/bin", "REGISTRY": "http://registry.example.com:5000"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        "make images: REGISTRY='http://registry.example.com:5000' is not host[:port][/prefix]"
        " (no scheme: for plain http add INSECURE=1)"
    ]
