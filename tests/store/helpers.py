"""Shared helpers: Hypothesis strategies for the CBOR model, real processes, the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from kxen_agent.session.sessions import NS

#: The namespaces the CLI opens its stores with (``Store.open(namespaces=(NS,))``).
#: A state dir that a test hands to the CLI, or whose skeleton it checks as
#: the CLI makes it (``objects_spec.md`` §10.3), is made with these.
CLI_NAMESPACES = (NS,)

#: The installed console script, next to the interpreter running the tests.
KXEN_AGENT = str(Path(sys.executable).with_name("kxen-agent"))

# ------------------------------------------------------------------ strategies

_INT_EDGES = [
    0, 1, 23, 24, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**64 - 1,
    -1, -24, -25, -256, -257, -65536, -65537, -(2**32), -(2**32) - 1, -(2**64),
]
ints = st.sampled_from(_INT_EDGES) | st.integers(-(2**64), 2**64 - 1)
_scalars = st.none() | st.booleans() | ints | st.text(max_size=40)


def cbor_values(leaves: st.SearchStrategy = _scalars | st.binary(max_size=40)) -> st.SearchStrategy:
    """Values of the store's CBOR model; depth is bounded by max_leaves (< MAX_DEPTH)."""
    return st.recursive(
        leaves,
        lambda children: st.lists(children, max_size=6)
        | st.dictionaries(st.text(max_size=12), children, max_size=6),
        max_leaves=30,
    )


values = cbor_values()
#: Values legal in a structured object: every byte string is a 32-byte link.
linked_values = cbor_values(_scalars | st.binary(min_size=32, max_size=32))


def same(a: Any, b: Any) -> bool:
    """Equality that also compares types (so True is not 1 and a list is not a tuple)."""
    if type(a) is not type(b):
        return False
    if type(a) is list:
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if type(a) is dict:
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


def mutations(data: bytes) -> st.SearchStrategy[bytes]:
    """``data`` with one bit flipped, one byte inserted, or one byte deleted."""

    def flip(t: tuple[int, int]) -> bytes:
        i, bit = t
        m = bytearray(data)
        m[i] ^= 1 << bit
        return bytes(m)

    def insert(t: tuple[int, int]) -> bytes:
        i, b = t
        return data[:i] + bytes([b]) + data[i:]

    def delete(i: int) -> bytes:
        return data[:i] + data[i + 1 :]

    n = len(data)
    return st.one_of(
        st.tuples(st.integers(0, n - 1), st.integers(0, 7)).map(flip),
        st.tuples(st.integers(0, n), st.integers(0, 255)).map(insert),
        st.integers(0, n - 1).map(delete),
    )


# ------------------------------------------------------------------ processes


def run_cli(state_dir: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run the real ``kxen-agent`` console script against ``state_dir``."""
    env = {**os.environ, "KXEN_AGENT_STATE_DIR": str(state_dir)}
    return subprocess.run([KXEN_AGENT, *args], env=env, capture_output=True, timeout=timeout, check=False)


def run_python(script: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run ``script`` in a fresh interpreter (the venv's) with ``args`` as argv[1:]."""
    return subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, timeout=timeout, check=False
    )


def one_line_error(stderr: bytes) -> str:
    """The single line a failing command printed; fails the test on a traceback."""
    text = stderr.decode("utf-8", "replace")
    assert "Traceback" not in text, text
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


def closure(store: Any, roots: Any) -> set[bytes]:
    """Every object reachable from ``roots`` in ``store`` (read back, links followed)."""
    from kxen_agent.store.objects import decode_body, links_of

    seen, stack = set(), list(roots)
    while stack:
        oid = stack.pop()
        if oid in seen:
            continue
        seen.add(oid)
        obj = store.read_raw(oid)
        stack.extend(links_of(obj.kind, decode_body(obj)))
    return seen
