"""Just enough of Kubernetes' protobuf encoding to read a Secret that a Go client wrote.

Go's typed clients (client-go's clientset, which Helm uses for its release records) send
built-in kinds as `application/vnd.kubernetes.protobuf`: the magic `k8s\\0`, then a
`runtime.Unknown` whose `raw` field holds the object's message. The fake reads Secrets
this way (names, labels, annotations, type, data) and refuses anything else, so a test
that needs more fails saying so; it always answers in JSON, which those clients accept.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

MAGIC = b"k8s\x00"


def _fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) of each field: an int for varints, bytes for the rest."""
    i = 0
    while i < len(data):
        key, i = _varint(data, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(data, i)
            yield number, value
        elif wire == 2:
            size, i = _varint(data, i)
            yield number, data[i : i + size]
            i += size
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            yield number, data[i : i + width]
            i += width
        else:
            raise ValueError(f"protobuf wire type {wire} is not read here")


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, i
        shift += 7


def _text(value: int | bytes) -> str:
    assert isinstance(value, bytes)
    return value.decode()


def _entry(value: int | bytes) -> tuple[str, bytes]:
    """A map entry: key (1), value (2)."""
    assert isinstance(value, bytes)
    entry = {n: v for n, v in _fields(value)}
    raw = entry.get(2, b"")
    return _text(entry.get(1, b"")), raw if isinstance(raw, bytes) else b""


def _metadata(data: bytes) -> dict[str, Any]:
    # ObjectMeta: name 1, generateName 2, namespace 3, labels 11, annotations 12. Go writes
    # empty strings too; JSON would leave them out.
    meta: dict[str, Any] = {}
    for number, value in _fields(data):
        if number in (1, 2, 3) and value:
            meta[("name", "generateName", "namespace")[number - 1]] = _text(value)
        elif number in (11, 12):
            key, raw = _entry(value)
            meta.setdefault("labels" if number == 11 else "annotations", {})[key] = raw.decode()
    return meta


def decode_secret(body: bytes) -> dict[str, Any]:
    """The Secret in a protobuf request body, as the JSON form the fake stores."""
    if not body.startswith(MAGIC):
        raise ValueError("not Kubernetes protobuf (no k8s magic)")
    unknown = dict(_fields(body[len(MAGIC) :]))
    type_meta = {n: _text(v) for n, v in _fields(unknown.get(1, b""))}  # type: ignore[arg-type]
    if type_meta.get(2) != "Secret":
        raise ValueError(f"only Secrets are read from protobuf here, not {type_meta.get(2)!r}")
    secret: dict[str, Any] = {"apiVersion": type_meta.get(1, "v1"), "kind": "Secret"}
    for number, value in _fields(unknown.get(2, b"")):  # type: ignore[arg-type]
        if number == 1:
            assert isinstance(value, bytes)
            secret["metadata"] = _metadata(value)
        elif number == 2:
            key, raw = _entry(value)
            secret.setdefault("data", {})[key] = base64.b64encode(raw).decode()
        elif number == 3:
            secret["type"] = _text(value)
        elif number == 5:
            secret["immutable"] = bool(value)
    return secret
