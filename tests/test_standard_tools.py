"""The rule for tests that check objects with the standard tools (``zstd``, ``b3sum``).

A fresh machine often lacks ``b3sum``: the README's test command must still
pass there, and say in pytest's ``-rs`` summary what it did not check. CI
(``.ci/run``) sets ``KXEN_AGENT_REQUIRE_TOOLS=1``, under which a missing tool
fails the test instead, so the check cannot vanish unnoticed.

Each case runs a small pytest session (pytester) with PATH holding only the
tools the case gives it, stand-in scripts, as on a fresh machine.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import REQUIRE_TOOLS_ENV

INNER = '''
import subprocess
import pytest
from tests.helpers import require_tools


def test_by_call():
    require_tools("zstd", "b3sum")
    assert subprocess.run(["b3sum"], capture_output=True, text=True).stdout == "b3sum ran\\n"


@pytest.mark.tools("zstd", "b3sum")
def test_by_marker():
    assert subprocess.run(["zstd"], capture_output=True, text=True).stdout == "zstd ran\\n"
'''


def _run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tools: tuple[str, ...],
         require: str | None) -> pytest.RunResult:
    bin_dir = pytester.path / "bin"
    bin_dir.mkdir()
    for tool in tools:
        exe = bin_dir / tool
        exe.write_text(f"#!/bin/sh\necho {tool} ran\n")
        exe.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    if require is None:
        monkeypatch.delenv(REQUIRE_TOOLS_ENV, raising=False)
    else:
        monkeypatch.setenv(REQUIRE_TOOLS_ENV, require)
    pytester.makepyfile(test_inner=INNER)
    # The inner session loads the suite's conftest (the ``tools`` marker and its hook) as a plugin.
    return pytester.runpytest("-rs", "-p", "no:cacheprovider", "-p", "no:hypothesispytest", "-p", "tests.conftest")


def test_tools_installed_the_tests_run_them(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    res = _run(pytester, monkeypatch, ("zstd", "b3sum"), require="1")
    res.assert_outcomes(passed=2)


def test_a_missing_tool_skips_and_the_summary_names_it(pytester: pytest.Pytester,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    res = _run(pytester, monkeypatch, ("zstd",), require=None)
    res.assert_outcomes(skipped=2)
    assert res.ret == 0
    skips = [ln for ln in res.outlines if ln.startswith("SKIPPED")]
    # One line per test, at the test's own line, naming only the missing tool.
    assert len(skips) == 2, res.outlines
    assert all("test_inner.py:" in ln and "b3sum not on PATH" in ln for ln in skips), skips
    assert not any("zstd" in ln.split("not on PATH")[0] for ln in skips), skips


@pytest.mark.parametrize("require", ["0", ""])
def test_only_the_value_1_requires_the_tools(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                             require: str) -> None:
    res = _run(pytester, monkeypatch, ("b3sum",), require=require)
    res.assert_outcomes(skipped=2)


def test_a_missing_tool_fails_when_required(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    res = _run(pytester, monkeypatch, ("zstd",), require="1")
    # By call the test fails; by marker, setup fails (an error): neither is a pass or a skip.
    res.assert_outcomes(failed=1, errors=1)
    assert res.ret == 1
    res.stdout.fnmatch_lines([f"*b3sum not on PATH*{REQUIRE_TOOLS_ENV}=1 requires them*"])
