"""Kill torture (issue 7, item 1): the fast subset of :mod:`tests.reliability.torture`.

Real ``kxen-agent`` runs are SIGKILLed at random moments and at every fault
point, resumed until terminal, their UNKNOWN operations resolved by looking
at the real side effects; the invariants are checked after every trial. The
long mode (thousands of trials) is ``python -m tests.reliability.torture
--trials N``. ``KXEN_TORTURE_SEED`` fixes the seed (it is printed either way).
"""

from __future__ import annotations

import copy
import json
import os
import random
from pathlib import Path

import pytest

from tests.helpers import depth, long_mode
from tests.reliability.torture import (
    FAULT_POINTS,
    TOKEN_RE,
    VERDICT_ABSENT,
    VERDICT_PRESENT,
    KillFigures,
    Seen,
    check_run,
    kill_torture,
    trial_seeds,
)

#: The fast subset: trials started within the budget (two workers for the two cores);
#: each worker runs its forced trials and at least one random one whatever the budget.
#: ``KXEN_TEST_LONG=1``: 40 trials in 50 s, every fault point forced. (A budget of 8 s cost
#: 16 s of CPU for two or three more random trials than 5 s: the long mode and the torture
#: command run hundreds.)
TRIALS = depth(fast=8, long=40)
BUDGET_S = float(depth(fast=5, long=50))


def _seed() -> int:
    return int(os.environ.get("KXEN_TORTURE_SEED") or random.randrange(10**6))


#: The two fault points that leave an UNKNOWN op first, deterministically, so both
#: verdicts of the human are exercised; then random kills. Every other fault point is
#: crashed at once by a real process in tests/runtime/test_faults.py (and in memory by
#: test_runloop_memory.py); the long mode forces each here too.
_UNKNOWN_FIRST = ("tool:after-started", "tool:after-effect")
FORCED = _UNKNOWN_FIRST + (tuple(p for p in FAULT_POINTS if p not in _UNKNOWN_FIRST) if long_mode() else ())


@pytest.fixture(scope="module")
def torture(tmp_path_factory: pytest.TempPathFactory) -> tuple[KillFigures, Path, int]:
    root = tmp_path_factory.mktemp("kill-torture")
    seed = _seed()
    figs = kill_torture(TRIALS, seed=seed, root=root, workers=2, time_budget_s=BUDGET_S, exec_fraction=0.1,
                        forced=FORCED)
    print(figs.summary())
    return figs, root, seed


@pytest.mark.slow
def test_kill_torture_fast_subset(torture: tuple[KillFigures, Path, int]) -> None:
    figs, _, seed = torture
    replay = (f"replay: KXEN_TORTURE_SEED={seed} pytest {__file__}, "
              f"or python -m tests.reliability.torture --trials {TRIALS} --seed {seed}")
    assert not figs.failed, f"{figs.summary()}\n{replay}"
    # The budget bounds the random trials (fewer on a loaded machine); the forced ones and
    # each worker's first random one always run.
    assert figs.trials >= len(FORCED) + 2, f"a worker ran no random trial: {figs.summary()}"
    assert figs.kills > 0 and figs.faults >= len(FORCED), figs.summary()
    assert figs.unknowns >= 2, f"the forced UNKNOWN trials resolved nothing: {figs.summary()}"


@pytest.fixture(scope="module")
def two_trials(torture: tuple[KillFigures, Path, int]) -> dict[str, dict]:
    """The trials forced to crash at the two UNKNOWN points, kept with the evidence their checks saw."""
    figs, root, seed = torture
    assert not figs.failed, figs.summary()
    docs = {}
    for point, trial_seed in zip(FORCED[:2], trial_seeds(seed, 2)):
        [d] = root.glob(f"w*/trial-{trial_seed}")
        docs[point] = dict(json.loads((d / "final.json").read_text()), dir=d)
    return docs


def _check(doc: dict, **changes) -> list[str]:
    d = copy.deepcopy({k: v for k, v in doc.items() if k != "dir"})
    d.update(changes)
    s = d["seen"]
    seen = Seen(ops=s["ops"], states=s["states"], logs=[[tuple(x) for x in log] for log in s["logs"]],
                unknown_reported=set(s["unknown_reported"]), resolved=set(s["resolved"]))
    return check_run(d["show"], d["log"], seen=seen, chain=d["chain"], verdicts=d["verdicts"],
                     effects=doc["dir"] / "effects.log", ws=doc["dir"] / "ws", calls=d["calls"], run=d["run"])


@pytest.mark.slow
def test_the_checker_catches_each_kind_of_violation(two_trials: dict[str, dict]) -> None:
    """A harness that cannot fail proves nothing: doctor a real trial's evidence and watch each check fire."""
    doc = two_trials["tool:after-effect"]
    assert _check(doc) == []
    journal = doc["show"]["journal"]
    human = next(j for j in journal if j["callId"] == "call_0_0")
    assert (human["source"], human["outcome"]) == ("human", {"output": VERDICT_PRESENT, "isError": False})
    tool_shell = [j for j in journal if j["source"] == "tool" and j["tool"] == "shell"]
    effects = doc["dir"] / "effects.log"
    lines = effects.read_text()

    def expect(fragment: str, **changes) -> None:
        bad = _check(doc, **changes)
        assert any(fragment in b for b in bad), (fragment, bad)

    # A side effect run twice.
    effects.write_text(lines + lines.splitlines()[0] + "\n")
    expect("ran 2 times")
    # An op the tool says is known, whose effect is missing.
    if tool_shell:
        tok = TOKEN_RE.search(tool_shell[0]["arguments"]).group(0)
        effects.write_text("".join(f"{x}\n" for x in lines.splitlines() if x != tok))
        expect("its effect is missing")
    effects.write_text(lines)
    # The human's verdict contradicted by the effect.
    expect("the human found", verdicts={human["op"]: False})
    # An op shown earlier that is gone, or that went backwards.
    show = copy.deepcopy(doc["show"])
    show["journal"] = [j for j in show["journal"] if j["op"] != human["op"]]
    expect("is gone from the journal", show=show)
    seen = copy.deepcopy(doc["seen"])
    first = journal[0]
    seen["ops"][first["op"]] = [dict(first, state="Settled")]
    show = copy.deepcopy(doc["show"])
    show["journal"][0]["state"] = "OutcomeKnown"
    expect("went back from Settled", seen=seen, show=show)
    # A run state shown earlier that is no longer an ancestor of the final one.
    expect("not ancestors", seen=dict(doc["seen"], states=doc["seen"]["states"] + ["00" * 32]))
    # A tool result twice in the history; a history rewritten under what was shown.
    log = copy.deepcopy(doc["log"])
    dup = next(m for m in log if m["role"] == "tool")
    log.insert(log.index(dup) + 1, dict(dup))
    expect("tool results per call id", log=log)
    expect("not a prefix", seen=dict(doc["seen"], logs=[[["msg_x", 0]]]))
    # A second final message; an unfinished run.
    log = copy.deepcopy(doc["log"])
    log.append(dict(log[-1], seq=len(log)))
    expect("final messages", log=log)
    expect("run ended", show=dict(doc["show"], status="input_required", settled=False))


@pytest.mark.slow
def test_an_unrun_call_is_resolved_not_run(two_trials: dict[str, dict]) -> None:
    """Killed after ``Started``: the token is absent, the human says so, and the call never runs later."""
    doc = two_trials["tool:after-started"]
    # The forced crash hit the script's first call; later random kills may add other UNKNOWNs.
    first = next(j for j in doc["show"]["journal"] if j["callId"] == "call_0_0")
    assert (first["tool"], first["source"], first["outcome"]) == ("shell", "human", {"output": VERDICT_ABSENT, "isError": True})
    token = TOKEN_RE.search(first["arguments"]).group(0)
    # No effect at all leaves no log: a trial whose only shell call is this one.
    effects = doc["dir"] / "effects.log"
    assert not effects.exists() or token not in effects.read_text().split()
