"""The rule: a run's status words are spelt in one module, ``kxen_agent/session/status.py``.

Every other module of ``kxen_agent`` names them through
:mod:`kxen_agent.session.status` (``RunStatus.COMPLETED``, ``OpState.STARTED``,
``INTERRUPTED`` ...), so a word cannot be misspelt in one place, and the
§14.5/§14.6 vocabularies cannot drift apart between the schema, the runner,
recovery and the CLI.

What the test flags: a string literal (a constant, or a whole f-string piece)
*equal* to one of :data:`~kxen_agent.session.status.STATUS_WORDS`, anywhere in
``kxen_agent/`` but ``status.py``. Words another vocabulary shares are not in
that set (``tool`` and ``user`` are message roles, ``policy`` the lock's table,
``cancel`` an event, ``yes``/``no``/``--yes``/``trust`` CLI words), so the rule
never fires on an unrelated use of the same spelling; a docstring or message
that merely *contains* a word (``"the run failed"``) is not a literal equal to it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import kxen_agent
from kxen_agent.session import status
from kxen_agent.session.status import STATUS_WORDS, OpState, RunStatus

PACKAGE = Path(kxen_agent.__file__).parent
HOME = PACKAGE / "session" / "status.py"

# Modules another change must convert (their owners edit them): path -> how many literals they still
# hold. An entry may only shrink: the test fails if a module holds more than listed, or fewer (then the
# entry must go).
PENDING: dict[str, int] = {}


def literals(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and type(node.value) is str and node.value in STATUS_WORDS:
            found.append((node.lineno, node.value))
    return found


def offenders() -> dict[str, list[tuple[int, str]]]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == HOME:
            continue
        hits = literals(ast.parse(path.read_text(encoding="utf-8"), str(path)))
        if hits:
            out[path.relative_to(PACKAGE).as_posix()] = hits
    return out


def test_no_status_word_is_spelt_outside_status_py() -> None:
    found = offenders()
    wrong = {p: hits for p, hits in found.items() if len(hits) != PENDING.get(p, 0)}
    gone = [p for p in PENDING if p not in found]
    assert not wrong, f"status words spelt outside kxen_agent/session/status.py (use its enums): {wrong}"
    assert not gone, f"PENDING lists modules that no longer spell a status word; remove them: {gone}"


def test_the_rule_sees_what_it_must() -> None:
    # Each form a word can take in code is caught; text that only contains a word is not.
    code = ('x == "failed"\nf(state="Settled")\n{"OutcomeUnknown": 1}\nf"{a}"\n"the run failed"\n'
            '"""completed"""\n')
    assert sorted(w for _, w in literals(ast.parse(code))) == ["OutcomeUnknown", "Settled", "completed", "failed"]


def test_the_words_are_those_of_the_spec() -> None:
    assert {s.value for s in RunStatus} == {"running", "input_required", "completed", "failed", "canceled"}
    assert {s.value for s in OpState} == {"PendingApproval", "Decided", "Started", "OutcomeKnown", "Settled",
                                          "OutcomeUnknown"}
    # Every run status and op state is guarded; the shared words are not.
    assert {s.value for s in RunStatus} | {s.value for s in OpState} | {status.INTERRUPTED} <= STATUS_WORDS
    assert not STATUS_WORDS & {"tool", "user", "policy", "cancel", "yes", "no", "--yes", "trust"}
