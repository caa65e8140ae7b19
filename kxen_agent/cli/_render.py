"""Rendering helpers shared by the commands: JSON, one-line errors, progress."""

from __future__ import annotations

import json
import sys
from typing import Any

import typer


def emit_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2, sort_keys=False, ensure_ascii=False) + "\n")


def out(line: str = "") -> None:
    typer.echo(line)


def err(line: str) -> None:
    typer.echo(line, err=True)


def to_jsonable(v: Any) -> Any:
    """CBOR-model values as JSON: links (bytes) become hex strings."""
    if isinstance(v, bytes):
        return v.hex()
    if isinstance(v, dict):
        return {k: to_jsonable(x) for k, x in v.items()}
    if isinstance(v, list):
        return [to_jsonable(x) for x in v]
    return v


class Progress:
    """A one-line progress counter on an interactive stderr; silent otherwise."""

    def __init__(self, label: str, total: int | None = None, enabled: bool = True) -> None:
        self.label = label
        self.total = total
        self.n = 0
        self.enabled = enabled and sys.stderr.isatty()
        self._last = -1

    def __call__(self, k: int = 1) -> None:
        self.n += k
        if not self.enabled:
            return
        pct = None if not self.total else int(100 * self.n / self.total)
        key = pct if pct is not None else self.n // 1000
        if key == self._last:
            return
        self._last = key
        msg = f"\r{self.label}: {self.n}" + (f"/{self.total} ({pct}%)" if pct is not None else "")
        sys.stderr.write(msg)
        sys.stderr.flush()

    def done(self) -> None:
        if self.enabled and self._last != -1:
            sys.stderr.write("\n")
            sys.stderr.flush()
