"""Issue 25, item 9: what a model or a tool wrote reaches a terminal escaped (bidi overrides and
isolates, line separators, C1 controls) — in the approval prompt, the streamed answer and a tool's
result line; and ``session delete`` during a live run is refused (exit 75, the lease's word) with
the run unharmed."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import Cli, spawn_kxen, wait_for_file, write_agent

from .test_approvals import PROMPT, PtyRun, run_args

RLO = "\u202e"  # RIGHT-TO-LEFT OVERRIDE: reorders what follows on the line ("Trojan Source")
ISOLATE = "\u2067"  # RIGHT-TO-LEFT ISOLATE
RAW = [c.encode() for c in (RLO, ISOLATE, "\u2028", "\u009b")]


def test_bidi_controls_reach_the_terminal_escaped(cli: Cli, workspace: Path, tmp_path: Path) -> None:
    # The command holds the controls (the approval prompt shows it); its output holds them (the
    # result line shows it); the model's text holds them (streamed to the terminal).
    command = f"printf 'gpj.{RLO}exe{ISOLATE}\\n'"
    steps = [{"content": f"say {RLO}olleh{ISOLATE} \u2028 now", "tool_calls": [
        {"name": "shell", "arguments": {"command": command}}]}, {"content": f"done {RLO}txt.exe"}]
    agent = write_agent(tmp_path / "agent", steps, policy={"approve": ["shell"]})
    p = PtyRun(cli, *run_args(workspace, agent))
    p.wait_for(PROMPT)
    assert b"wants to call shell" in p.screen
    assert b"\\u202e" in p.screen and b"\\u2067" in p.screen, p.screen
    p.answer("y")
    rc, res = p.finish()
    assert rc == 0 and res["status"] == "completed", p.screen
    screen = p.screen
    for raw in RAW:
        assert raw not in screen, f"{raw!r} reached the terminal:\n{screen.decode(errors='replace')}"
    assert b"<- ok: gpj.\\u202eexe\\u2067" in screen, screen  # the tool's result line
    assert b"say \\u202eolleh\\u2067" in screen, screen  # the streamed answer
    # The run's JSON on stdout is exact: the characters, as JSON escapes a reader undoes.
    assert res["result"] == f"done {RLO}txt.exe"


def test_session_delete_during_a_live_run_is_refused_and_the_run_goes_on(
        cli: Cli, workspace: Path, tmp_path: Path) -> None:
    steps = [{"content": "waiting", "tool_calls": [{"name": "shell", "arguments": {
        "command": "touch started; while [ ! -f go ]; do sleep 0.05; done; echo released"}}]},
             {"content": "finished"}]
    agent = write_agent(tmp_path / "agent", steps)
    proc = spawn_kxen(run_args(workspace, agent), env=cli.env)
    try:
        wait_for_file(workspace / "started", proc)
        [ses] = [s["id"] for s in cli.sessions()]
        refused = cli("session", "delete", ses)
        assert refused.rc == 75, str(refused)
        assert refused.err.startswith(f"kxen-agent: error: session {ses} is busy: its run lease is held by pid "), \
            str(refused)
        assert len(refused.err.strip().splitlines()) == 1 and "Traceback" not in refused.err
        (workspace / "go").write_text("")
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert '"status": "completed"' in out and '"result": "finished"' in out
    [listed] = cli.sessions()
    assert listed["id"] == ses and not listed.get("deleted"), listed
    tool = [m["content"] for m in cli.log(ses) if m["role"] == "tool"]
    assert tool and "released" in tool[0]
    cli("session", "delete", ses, expect=0)  # idle: deleted as before
    assert cli.sessions() == []
