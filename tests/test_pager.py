"""`session diff` on a terminal pages through the user's PAGER (the click pager it once called is not shipped)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from kxen_agent.cli import checkpoint_cmds


def test_the_diff_goes_through_the_users_pager(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    got = tmp_path / "paged"
    pager = tmp_path / "pager"
    pager.write_text(f"#!/bin/sh\necho \"LESS=$LESS\" > '{got}'\ncat >> '{got}'\n")
    pager.chmod(0o755)
    monkeypatch.setenv("PAGER", str(pager))
    monkeypatch.delenv("LESS", raising=False)
    checkpoint_cmds._page("diff --git a/x b/x\n+é\n")
    assert got.read_text() == "LESS=FRX\ndiff --git a/x b/x\n+é\n"


def test_a_missing_pager_still_shows_the_diff(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setenv("PAGER", "/nonexistent/pager --flag")
    checkpoint_cmds._page("+line\n")
    assert capsys.readouterr().out == "+line\n"
    monkeypatch.setenv("PAGER", "cat")
    checkpoint_cmds._page("+two\n")
    assert capsys.readouterr().out == "+two\n"
