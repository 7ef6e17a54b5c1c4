"""The OpenAPI 3 document for the whole API, kept as YAML beside this module."""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

import yaml

from paddlecloud import __version__


@functools.cache
def openapi_document() -> dict[str, Any]:
    text = resources.files(__package__).joinpath("openapi.yaml").read_text()
    document: dict[str, Any] = yaml.safe_load(text)
    document["info"]["version"] = __version__
    return document
