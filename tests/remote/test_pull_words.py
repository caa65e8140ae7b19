"""`session pull` takes a prefix resolved on the remote, and `ls-remote` says ahead / behind / diverged
(issue 29): a real Git remote, two state dirs."""

from __future__ import annotations

import pytest

from tests.remote.conftest import Machine, Remote, both_went_on

PATH_ONLY = pytest.mark.parametrize("transport", ["path"])


def _local(m: Machine, ses: str) -> str:
    (row,) = [s for s in m.json("session", "ls-remote")["sessions"] if s["id"] == ses]
    return row["local"]


@PATH_ONLY
def test_pull_by_prefix_and_the_words_of_ls_remote(machines: tuple[Machine, Machine], served: Remote) -> None:
    a, b = machines
    ses = both_went_on(a, b)  # pulled by its whole id, then each state dir went on
    a.kx("session", "push", ses, expect=0)
    assert _local(a, ses) == "same"
    assert _local(b, ses) == "diverged"
    other = a.run("another task")["session"]
    a.kx("session", "push", other, expect=0)
    refused = b.kx("session", "pull", "ses_ffff", cwd=b.ws)
    assert refused.rc == 1 and "no session on" in refused.err and "begins with ses_ffff" in refused.err, str(refused)
    assert b.json("session", "pull", other[:9])["sessions"] == {other: "created"}  # a prefix, as everywhere
    a.kx("--resume", other, "--task", "more", "--json", expect=0)
    assert _local(a, other) == "ahead"
    a.kx("session", "push", other, expect=0)
    assert _local(b, other) == "behind"
