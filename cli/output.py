"""Rendering command results: aligned tables for people, JSON and YAML for scripts."""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from typing import Any

# csv only for the commands whose answer is rows of numbers (`paddlecloud metrics`): they
# set `csv=True` in their parser's defaults, and main() refuses it for any other.
FORMATS = ("table", "json", "yaml", "csv")
# A column is a header and either the key to read from each row or a function of the row.
Getter = str | Callable[[Mapping[str, Any]], Any]
Column = tuple[str, Getter]
COLUMN_GAP = "  "


def render_json(data: Any) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def render_yaml(data: Any) -> str:
    import yaml  # only `-o yaml` pays for it (start-up time)

    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, default_flow_style=False)


def plain(data: Any) -> Any:
    """The SDK's answers in `data` (lists and maps of them too) as the server sent them."""
    to_dict = getattr(data, "to_dict", None)
    if callable(to_dict):
        return to_dict()
    if isinstance(data, list | tuple):
        return [plain(item) for item in data]
    if isinstance(data, dict):
        return {key: plain(value) for key, value in data.items()}
    return data


def render_data(data: Any, fmt: str) -> str:
    """`data` as JSON or YAML, exactly as given: scripts read the server's own field names."""
    data = plain(data)
    if fmt == "json":
        return render_json(data)
    if fmt == "yaml":
        return render_yaml(data)
    raise ValueError(f"not a data format: {fmt!r} (json or yaml)")


def cell(value: Any) -> str:
    """One table cell: `-` for nothing, yes/no for booleans, lists and maps on one line."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, Mapping):
        return ",".join(f"{k}={cell(v)}" for k, v in value.items()) or "-"
    if isinstance(value, list | tuple):
        return ",".join(cell(v) for v in value) or "-"
    # A newline inside a cell would break the row apart.
    text = str(value)
    return " ".join(text.split()) if "\n" in text or "\r" in text or "\t" in text else text


def text_width(text: str) -> int:
    """Columns a string takes on a terminal: East Asian wide characters take two."""
    if text.isascii():
        return len(text)
    return sum(2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1 for ch in text)


def _get(row: Mapping[str, Any], getter: Getter) -> Any:
    return getter(row) if callable(getter) else row.get(getter)


def render_table(
    rows: Sequence[Mapping[str, Any]], columns: Sequence[Column] | None = None, *, empty: str | None = None
) -> str:
    """Rows under upper-case headers, columns padded to line up; `empty` replaces a table with no rows.

    Without `columns`, every key seen in the rows becomes a column, in first-seen order.
    """
    if not rows and empty is not None:
        return empty + "\n"
    if columns is None:
        keys: dict[str, None] = {}
        for row in rows:
            keys.update(dict.fromkeys(row))
        columns = [(key.upper(), key) for key in keys]
    return render_rows(rows, columns)[0]


def render_rows(
    rows: Sequence[Mapping[str, Any]], columns: Sequence[Column], widths: Sequence[int] | None = None
) -> tuple[str, list[int]]:
    """Rows padded to `widths`, and the widths used. Without `widths`, the headers come first
    and the widths are those of these rows: a table printed a page at a time takes its widths
    from its first page, and a later cell that is wider pushes only its own row along."""
    grid = [[cell(_get(row, getter)) for _, getter in columns] for row in rows]
    if widths is None:
        grid.insert(0, [header for header, _ in columns])
        widths = [max(text_width(line[i]) for line in grid) for i in range(len(columns))]
    lines = []
    for line in grid:
        padded = [text + " " * (widths[i] - text_width(text)) for i, text in enumerate(line)]
        lines.append(COLUMN_GAP.join(padded).rstrip())
    return "\n".join(lines) + "\n" if lines else "", list(widths)


def render_record(record: Mapping[str, Any], fields: Sequence[Column] | None = None) -> str:
    """One object as `Label: value` lines with the values lined up."""
    if fields is None:
        fields = [(key, key) for key in record]
    labels = [f"{label}:" for label, _ in fields]
    width = max((text_width(label) for label in labels), default=0)
    return "".join(
        f"{label}{' ' * (width - text_width(label))} {cell(_get(record, getter))}\n"
        for label, (_, getter) in zip(labels, fields, strict=True)
    )
