"""``session grep``'s lean start (cli/grep_lean.py, cli/start.py): the same stdout, stderr and exit code as
the typer command for every command line it reads, and typer's own answer for every other.

Both ways run as processes over one small state dir built by the CLI (real runs, a fork, a name).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kxen_agent.cli.grep_lean import parse
from tests.helpers import CLI_TIMEOUT_S
from tests.session.test_cli_sessions import Kx, make_repo

#: The lean way: the console script's dispatch, then a check that the typer app was never imported.
LEAN = ("import sys\nfrom kxen_agent.cli.start import run\ncode = run(sys.argv[1:])\n"
        "sys.exit(97 if 'kxen_agent.cli.main' in sys.modules else code)\n")
#: The typer way: the root app itself, as every other command runs.
TYPER = "import sys\nfrom kxen_agent.cli.main import main\nsys.exit(main(sys.argv[1:]))\n"


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory) -> tuple[Kx, dict[str, str]]:
    tmp = tmp_path_factory.mktemp("grep-lean")
    kx = Kx(tmp)
    repo = make_repo(tmp / "repo", kx.env)
    root = kx.json("run", "--workspace", str(repo), "--task", "alpha-task", "-n", "root")["session"]
    fork = kx.json("session", "fork", "root")["id"]
    kx.json("--resume", fork, "--task", "only-in-the-fork NOTES")
    other = kx.json("run", "--workspace", str(repo), "--task", "beta-task NOTES.md")["session"]
    return kx, {"root": root, "fork": fork, "other": other}


def _run(kx: Kx, code: str, args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], env=kx.env, capture_output=True,
                          stdin=subprocess.DEVNULL, timeout=CLI_TIMEOUT_S)


CASES = [
    # (arguments, the lean way reads them)
    (["alpha-task"], True),
    (["-E", r"^(alpha|beta)-task\b", "--json"], True),
    (["--regex", "NOTES\\.md$", "-i"], True),
    (["-il", "notes.md"], True),
    (["--role", "tool", "NOTES.md"], True),
    (["write_file", "--role=assistant", "--json"], True),
    (["NOTES", "--session", "root", "--json"], True),  # by name
    (["NOTES", "-s", "{other:.12}"], True),  # by prefix
    (["-s{fork}", "-l", "NOTES"], True),
    (["alpha-task", "--since", "2999-01-01", "--json"], True),  # nothing that recent: exit 1
    (["alpha-task", "--since=1w"], True),
    (["--sessions-with-matches", "task"], True),
    (["no such text anywhere"], True),  # exit 1, nothing printed
    (["-E", "z*", "-l"], True),  # an empty match, at the end of a file's text too
    (["-E", "("], True),  # one-line error, exit 2
    (["x", "--session", "ses_0000nosuch"], True),  # unknown session
    (["x", "--role", "bogus"], True),  # exit 2
    (["x", "--since", "soon"], True),  # exit 2
    (["--rolex", "x"], False),  # click's "no such option", typer's way
    ([], False),  # missing PATTERN
]


def test_the_lean_start_answers_as_the_typer_command(state: tuple[Kx, dict[str, str]]) -> None:
    kx, ids = state
    codes = set()
    for args, lean in CASES:
        args = [a.format(**ids) for a in args]
        assert (parse(args) is not None) == lean, args
        want = _run(kx, TYPER, ["session", "grep", *args])
        got = _run(kx, LEAN, ["session", "grep", *args])
        if not lean:
            assert got.returncode == 97, args  # went to typer, as it should
            got.returncode = want.returncode
        assert (got.returncode, got.stdout, got.stderr) == (want.returncode, want.stdout, want.stderr), args
        assert b"Traceback" not in want.stderr and (want.returncode != 0 or want.stdout), (args, want)
        codes.add(want.returncode)
    assert codes == {0, 1, 2}


def test_parse_leaves_to_click_what_only_click_can_answer() -> None:
    assert parse(["-isfoo", "p", "--since", "2d"]) == {
        "pattern": "p", "regex": False, "ignore_case": True, "sessions_only": False, "json_out": False,
        "role": [], "session": ["foo"], "since": "2d"}
    assert parse(["--role", "tool", "--role=user", "-E", "x"])["role"] == ["tool", "user"]  # type: ignore[index]
    for args in (["--help", "x"], ["-h"], ["--", "-x"], ["a", "b"], ["--role"], ["x", "-s"], ["--json=1", "x"],
                 ["-s", "-x", "p"], ["-"], ["-q", "x"], ["--regex=", "x"]):
        assert parse(args) is None, args
