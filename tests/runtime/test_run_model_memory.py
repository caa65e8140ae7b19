"""The run loop's model side in-process, over a ``MemoryStore`` with a fake provider.

What a provider answers is a list the test writes (turns, errors, a cancel
mid-answer); the runner's decisions are checked on what it stores: answers
cut off or empty fail the run and record nothing of themselves, retries
follow the policy and count true attempts, a canceled model call ends the run
``canceled`` whatever the call was doing, ``--retry`` starts a new run on the
same task without a second task message, overrides of model and endpoint
are recorded and kept by a resumed run, usage is recorded per turn and
summed, and run states written before these keys existed still read.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable

import pytest

from kxen_agent.errors import UsageError
from kxen_agent.runtime.events import ProviderRetry, RunStarted, TextDelta, ToolFinished, ToolStarted, TurnFinished, TurnStarted
from kxen_agent.runtime.providers import AssistantTurn, ModelEndpoint, ProviderCanceled, ProviderError, ToolCall, Usage
from kxen_agent.runtime.retry import RetryPolicy
from kxen_agent.runtime.runner import NothingToRetry, RunError, Runner, sum_usage
from kxen_agent.session.agent_def import default_agent_definition
from kxen_agent.session.schema import check, put
from kxen_agent.session.sessions import SessionStore
from kxen_agent.store.memory import MemoryStore

LOCK = dict(default_agent_definition([{"content": "unused"}]), provider="openai", model="gpt-lock",
            base_url="http://lock.invalid/v1", api_key_env=None, script=None)

Step = AssistantTurn | Exception | Callable[[threading.Event, Any], AssistantTurn]


def final(text: str, usage: Usage | None = None, reason: str | None = "stop") -> AssistantTurn:
    return AssistantTurn(content=text, tool_calls=(), model="gpt-served", finish_reason=reason, usage=usage)


def calls(*names: str, usage: Usage | None = None) -> AssistantTurn:
    return AssistantTurn(content=None, model="gpt-served", finish_reason="tool_calls", usage=usage,
                         tool_calls=tuple(ToolCall(None, n, "{}") for n in names))


class Crash(BaseException):
    """The process "dies" here: raised from the fault hook, caught by nothing in the runner."""


def crash_at(point: str) -> Callable[[str], None]:
    def hook(p: str) -> None:
        if p == point:
            raise Crash(p)

    return hook


class FakeModel:
    """Answers from ``steps`` in order (the last repeats); records what each call was given."""

    def __init__(self, steps: list[Step]) -> None:
        self.steps = list(steps)
        self.endpoints: list[ModelEndpoint] = []
        self.histories: list[list[dict]] = []
        self.closed = 0

    def factory(self, lock: dict, endpoint: ModelEndpoint) -> "FakeModel.Bound":
        self.endpoints.append(endpoint)
        return FakeModel.Bound(self, endpoint)

    class Bound:
        def __init__(self, model: "FakeModel", endpoint: ModelEndpoint) -> None:
            self.m, self.model, self.base_url = model, endpoint.model, endpoint.base_url

        def complete(self, messages: list[dict], tools: list[dict], *, cancel: threading.Event | None = None,
                     on_text: Any = None) -> AssistantTurn:
            self.m.histories.append(list(messages))
            step = self.m.steps.pop(0) if len(self.m.steps) > 1 else self.m.steps[0]
            if callable(step) and not isinstance(step, (AssistantTurn, Exception)):
                step = step(cancel, on_text)
            if isinstance(step, Exception):
                raise step
            if on_text is not None and step.content:
                on_text(step.content)
            return step

        def close(self) -> None:
            self.m.closed += 1


class Bench:
    def __init__(self, tmp: Path) -> None:
        self.store = MemoryStore("model")
        self.ws = tmp / "ws"
        self.ws.mkdir()
        self.events: list[Any] = []
        self.notes: list[str] = []

    def runner(self, model: FakeModel, **kw: Any) -> Runner:
        kw.setdefault("retry_policy", RetryPolicy(backoff_base_s=0.001))
        return Runner(self.store, providers=model.factory, listener=self.events.append, on_event=self.notes.append,
                      **kw)

    def start(self, model: FakeModel, task: str = "the task", **kw: Any):
        opts = {k: kw.pop(k) for k in ("model", "base_url") if k in kw}
        return self.runner(model, **kw).start(str(self.ws), task, dict(LOCK), **opts)

    def state(self, ses: str, run: str) -> dict:
        return Runner(self.store).run_state(SessionStore(self.store).get(ses), run)[1]

    def roles(self, ses: str) -> list[tuple[str, str | None]]:
        s = SessionStore(self.store)
        return [(m.role, m.content) for m in s.history(s.get(ses).head)]


@pytest.fixture
def bench(tmp_path: Path) -> Bench:
    return Bench(tmp_path)


# ==================================================================== answers that cannot complete a run


@pytest.mark.parametrize(("turn", "says"), [
    (final("The answer is cut o", reason="length"), "cut off at the model's output limit (finish_reason 'length')"),
    (final("", reason="content_filter"), "withheld by the provider's content filter (finish_reason 'content_filter')"),
    (AssistantTurn(content=None, tool_calls=(), model="m", finish_reason="tool_calls"), "no text and no tool call"),
    (AssistantTurn(content="  \n", tool_calls=(), model="m", finish_reason="stop"), "no text and no tool call"),
    (AssistantTurn(content=None, tool_calls=(), model="m", finish_reason="tool_calls", dropped_calls=("custom",)),
     "1 tool call(s) of type 'custom', which are not function calls"),
], ids=["length", "content_filter", "empty-tool-calls", "blank", "custom-calls"])
def test_an_answer_that_is_not_one_fails_the_run_and_records_nothing(bench: Bench, turn: AssistantTurn, says: str) -> None:
    res = bench.start(FakeModel([turn]))
    assert (res.status, res.settled, res.result, res.exit_code) == ("failed", True, None, 1)
    assert says in res.error and "nothing of it was recorded" in res.error, res.error
    assert "on turn 1" in res.error
    assert bench.roles(res.session) == [("user", "the task")], "no partial or empty answer in the history"
    assert bench.state(res.session, res.run)["turn"] == 0


def test_a_cut_off_answer_after_tool_turns_keeps_them(bench: Bench) -> None:
    res = bench.start(FakeModel([calls("list_files"), final("half", reason="length")]))
    assert res.status == "failed" and "turn 2" in res.error
    assert [r for r, _ in bench.roles(res.session)] == ["user", "assistant", "tool"]
    assert f"--resume {res.session} --retry" in res.error


# ==================================================================== retries


def test_transient_failures_are_retried_and_counted(bench: Bench) -> None:
    flaky = ProviderError("model provider at http://m returned HTTP 503: busy", transient=True, status=503)
    model = FakeModel([flaky, flaky, final("made it")])
    res = bench.start(model)
    assert (res.status, res.result) == ("completed", "made it")
    assert len(model.histories) == 3
    retries = [e for e in bench.events if isinstance(e, ProviderRetry)]
    assert [(e.turn, e.attempt, e.max_attempts) for e in retries] == [(1, 1, 5), (1, 2, 5)]
    assert [e.attempt for e in bench.events if isinstance(e, TurnStarted)] == [1, 2, 3]

    model = FakeModel([flaky])
    res = bench.start(model)
    assert res.status == "failed" and len(model.histories) == 5
    assert "gave up after 5 attempts" in res.error and "HTTP 503" in res.error


def test_a_failure_after_cancel_is_canceled_not_failed(bench: Bench) -> None:
    cancel = threading.Event()

    def fail_after_cancel(c: threading.Event, on_text: Any) -> AssistantTurn:
        cancel.set()  # Ctrl-C arrives while the request is failing
        raise ProviderError("connection reset", transient=True)

    model = FakeModel([fail_after_cancel])
    res = bench.start(model, cancel=cancel)
    assert (res.status, res.exit_code) == ("canceled", 130)
    assert "during the model call" in res.error and len(model.histories) == 1


def test_a_canceled_model_call_ends_the_run_canceled(bench: Bench) -> None:
    cancel = threading.Event()

    def aborted(c: threading.Event, on_text: Any) -> AssistantTurn:
        cancel.set()
        raise ProviderCanceled("aborted")

    res = bench.start(FakeModel([aborted]), cancel=cancel)
    assert (res.status, res.settled) == ("canceled", True)
    assert bench.roles(res.session) == [("user", "the task")]


def test_a_final_answer_arriving_after_cancel_does_not_complete_the_run(bench: Bench) -> None:
    cancel = threading.Event()

    def answers_late(c: threading.Event, on_text: Any) -> AssistantTurn:
        cancel.set()
        return final("late answer", usage=Usage(10, 2))

    res = bench.start(FakeModel([answers_late]), cancel=cancel)
    assert res.status == "canceled" and "its answer was not recorded" in res.error
    assert bench.roles(res.session) == [("user", "the task")]
    assert res.usage == {"inputTokens": 10, "outputTokens": 2, "turns": 1}, "the tokens were spent all the same"


# ==================================================================== --retry


def test_retry_starts_a_new_run_on_the_same_task_without_a_second_task_message(bench: Bench) -> None:
    bad = ProviderError("HTTP 400: nope", transient=False, status=400)
    first = bench.start(FakeModel([calls("list_files"), bad]))
    assert first.status == "failed"
    head_before = SessionStore(bench.store).get(first.session).head
    model = FakeModel([final("done now")])
    res = bench.runner(model).resume(first.session, retry=True)
    assert (res.status, res.result, res.retry_of, res.exit_code) == ("completed", "done now", first.run, 0)
    assert res.run != first.run
    st = bench.state(res.session, res.run)
    assert (st["index"], st["task"], st["retryOf"]) == (1, "the task", first.run)
    # The history goes on from where the failed run left it: one task message, its tool turn, the new answer.
    assert [r for r, _ in bench.roles(res.session)] == ["user", "assistant", "tool", "assistant"]
    assert [m["role"] for m in model.histories[0]] == ["system", "user", "assistant", "tool"]
    assert st["startHead"] == head_before, "the retry starts from the history as the failed run left it"
    started = [e for e in bench.events if isinstance(e, RunStarted)]
    assert started[-1].retry_of == first.run and not started[-1].resumed
    assert any(n.endswith(f"retrying run {first.run}") for n in bench.notes)


def test_retry_of_a_canceled_run(bench: Bench) -> None:
    cancel = threading.Event()
    cancel.set()
    first = bench.start(FakeModel([final("never")]), cancel=cancel)
    assert first.status == "canceled"
    res = bench.runner(FakeModel([final("ok")])).resume(first.session, retry=True)
    assert (res.status, res.retry_of) == ("completed", first.run)
    assert [r for r, _ in bench.roles(res.session)] == ["user", "assistant"]


def test_nothing_to_retry_says_what_to_do_instead(bench: Bench) -> None:
    done = bench.start(FakeModel([final("fine")]))
    with pytest.raises(NothingToRetry, match=r"completed; give the next task with `kxen-agent --resume .* --task TEXT`") as info:
        bench.runner(FakeModel([final("x")])).resume(done.session, retry=True)
    assert info.value.exit_code == 2
    with pytest.raises(UsageError, match="either --retry or --task"):
        bench.runner(FakeModel([final("x")])).resume(done.session, retry=True, task="t")

    crash = crash_at("tool:after-started")

    with pytest.raises(Crash):
        bench.runner(FakeModel([AssistantTurn(None, (ToolCall(None, "shell", '{"command": "true"}'),), "m", "tool_calls"),
                                final("x")]), fault=crash).start(str(bench.ws), "t", dict(LOCK))
    [unfinished] = [s for s in SessionStore(bench.store).list() if s.id != done.session]
    before = (unfinished.runs, unfinished.head)
    with pytest.raises(NothingToRetry, match=r"is unfinished \(running\); continue it with `kxen-agent --resume"):
        bench.runner(FakeModel([final("x")])).resume(unfinished.id, retry=True)
    after = SessionStore(bench.store).get(unfinished.id)
    assert (after.runs, after.head) == before, "a refused --retry writes nothing"


# ==================================================================== model and endpoint per run


def test_overrides_are_recorded_kept_by_resume_and_not_by_the_next_run(bench: Bench) -> None:
    crash = crash_at("provider:after-response")

    model = FakeModel([final("one")])
    with pytest.raises(Crash):
        bench.runner(model, fault=crash).start(str(bench.ws), "t", dict(LOCK), model="gpt-override",
                                               base_url="http://override.invalid/v1")
    [info] = SessionStore(bench.store).list()
    [run] = info.runs
    st = bench.state(info.id, run)
    assert (st["requestedModel"], st["baseUrl"], st["model"]) == ("gpt-override", "http://override.invalid/v1",
                                                                   "gpt-override")
    assert SessionStore(bench.store).agent(info)["model"] == "gpt-lock", "the lock stays as it was"

    res = bench.runner(model).resume(info.id)  # an unfinished run keeps what it recorded
    assert model.endpoints[-1] == ModelEndpoint("gpt-override", "http://override.invalid/v1")
    assert (res.requested_model, res.base_url) == ("gpt-override", "http://override.invalid/v1")

    nxt = bench.runner(model).resume(info.id, task="next")  # a new run: the lock's, unless given again
    assert model.endpoints[-1] == ModelEndpoint("gpt-lock", "http://lock.invalid/v1")
    assert (nxt.requested_model, nxt.base_url) == ("gpt-lock", "http://lock.invalid/v1")
    again = bench.runner(model).resume(info.id, task="third", model="gpt-3")
    assert model.endpoints[-1] == ModelEndpoint("gpt-3", "http://lock.invalid/v1") and again.requested_model == "gpt-3"


def test_an_unfinished_run_moved_elsewhere_can_be_pointed_at_a_new_endpoint(bench: Bench) -> None:
    crash = crash_at("provider:after-response")

    with pytest.raises(Crash):
        bench.runner(FakeModel([final("x")]), fault=crash).start(str(bench.ws), "t", dict(LOCK))
    [info] = SessionStore(bench.store).list()
    [run] = info.runs
    model = FakeModel([final("answered here")])
    res = bench.runner(model).resume(info.id, base_url="http://here.invalid/v1")
    assert res.status == "completed" and model.endpoints[-1] == ModelEndpoint("gpt-lock", "http://here.invalid/v1")
    assert bench.state(info.id, run)["baseUrl"] == "http://here.invalid/v1"
    assert any("now uses model gpt-lock at http://here.invalid/v1" in n for n in bench.notes)


def test_bad_overrides_are_refused_before_anything_is_written(bench: Bench) -> None:
    with pytest.raises(UsageError, match="--base-url"):
        bench.start(FakeModel([final("x")]), base_url="file:///etc/passwd")
    with pytest.raises(UsageError, match="--base-url applies to the openai and anthropic providers"):
        Runner(bench.store).start(str(bench.ws), "t", default_agent_definition([{"content": "x"}]),
                                  base_url="http://h/v1")
    assert SessionStore(bench.store).list() == []


# ==================================================================== usage


def test_usage_is_recorded_per_turn_and_summed(bench: Bench) -> None:
    model = FakeModel([calls("list_files", usage=Usage(100, 20, 60)), final("done", usage=Usage(150, 30))])
    res = bench.start(model)
    assert res.usage == {"inputTokens": 250, "outputTokens": 50, "cachedTokens": 60, "turns": 2}
    st = bench.state(res.session, res.run)
    assert st["turnUsage"] == {"turn": 2, "inputTokens": 150, "outputTokens": 30}
    assert Runner(bench.store).turn_usage(st) == [
        {"turn": 1, "inputTokens": 100, "outputTokens": 20, "cachedTokens": 60},
        {"turn": 2, "inputTokens": 150, "outputTokens": 30}]
    finished = [e for e in bench.events if isinstance(e, TurnFinished)]
    assert [(e.turn, e.tools, e.usage) for e in finished] == [
        (1, ("list_files",), {"inputTokens": 100, "outputTokens": 20, "cachedTokens": 60}),
        (2, (), {"inputTokens": 150, "outputTokens": 30})]
    # A turn the server reports nothing for is recorded as such, and not counted.
    res2 = bench.runner(FakeModel([calls("list_files"), final("x", usage=Usage(5, 1))])).resume(res.session, task="more")
    st2 = bench.state(res2.session, res2.run)
    assert res2.usage == {"inputTokens": 5, "outputTokens": 1, "turns": 1}
    assert [t["turn"] for t in Runner(bench.store).turn_usage(st2)] == [2]
    assert sum_usage([res.usage, res2.usage]) == {"inputTokens": 255, "outputTokens": 51, "cachedTokens": 60,
                                                  "turns": 3}
    assert sum_usage([None, None]) is None


# ==================================================================== events


def test_events_follow_the_run(bench: Bench) -> None:
    res = bench.runner(FakeModel([calls("list_files"), final("all done")]), stream=True).start(
        str(bench.ws), "t", dict(LOCK))
    kinds = [type(e).__name__ for e in bench.events]
    assert kinds == ["RunStarted", "TurnStarted", "TurnFinished", "ToolStarted", "ToolFinished",
                     "TurnStarted", "TextDelta", "TurnFinished"]
    tool_started = next(e for e in bench.events if isinstance(e, ToolStarted))
    tool_finished = next(e for e in bench.events if isinstance(e, ToolFinished))
    assert (tool_started.tool, tool_finished.op, tool_finished.state, tool_finished.is_error) == (
        "list_files", tool_started.op, "OutcomeKnown", False)
    assert [e.text for e in bench.events if isinstance(e, TextDelta)] == ["all done"]
    doc = bench.events[0].to_json()
    assert doc == {"event": "run_started", "session": res.session, "run": res.run, "index": 0, "model": "gpt-lock",
                   "baseUrl": "http://lock.invalid/v1", "retryOf": None, "resumed": False}


# ==================================================================== older run states


def test_a_run_state_written_before_the_new_keys_still_reads_and_resumes(bench: Bench) -> None:
    crash = crash_at("provider:after-response")

    with pytest.raises(Crash):
        bench.runner(FakeModel([final("x")]), fault=crash).start(str(bench.ws), "t", dict(LOCK), model="gpt-new")
    sessions = SessionStore(bench.store)
    [info] = sessions.list()
    [run] = info.runs
    oid = info.runs[run]
    st = bench.state(info.id, run)
    old = {k: v for k, v in st.items() if k not in ("requestedModel", "baseUrl", "retryOf", "usage", "turnUsage")}
    old["previous"] = oid
    check("run", old)
    with bench.store.step(info.group) as step:
        new_oid = put(step, "run", old)
        step.update(f"runs/{run}", oid, new_oid)
        step.commit("older writer")
    r = Runner(bench.store)
    shown = r.result_of(sessions.get(info.id), run, new_oid, old)
    assert (shown.requested_model, shown.base_url, shown.usage, shown.retry_of) == (
        "gpt-lock", "http://lock.invalid/v1", None, None), "the lock's, as before the keys existed"
    assert r.turn_usage(old) == []
    model = FakeModel([final("finished", usage=Usage(3, 4))])
    res = bench.runner(model).resume(info.id)
    assert res.status == "completed" and model.endpoints[-1] == ModelEndpoint("gpt-lock", "http://lock.invalid/v1")
    assert res.usage == {"inputTokens": 3, "outputTokens": 4, "turns": 1}


def test_a_failed_resume_of_a_terminal_run_points_at_retry(bench: Bench) -> None:
    res = bench.start(FakeModel([ProviderError("HTTP 400: bad", transient=False)]))
    with pytest.raises(RunError, match=f"or try it again with `kxen-agent --resume {res.session} --retry`"):
        bench.runner(FakeModel([final("x")])).resume(res.session)


# ==================================================================== the shape of the new keys (§14.5, §14.10)


def _spec_run_vector() -> dict:
    import ast
    import re

    spec = (Path(__file__).resolve().parents[2] / "objects_spec.md").read_text(encoding="utf-8")
    block = re.search(r"^vector: run-state-retry\nkind: run\nvalue: (.*)$", spec, re.M)
    assert block, "objects_spec.md §14.9 has the run-state-retry vector"
    return ast.literal_eval(block.group(1))


def test_the_spec_run_vector_passes_the_schema_and_broken_new_keys_do_not() -> None:
    from kxen_agent.store.objects import SchemaViolation

    value = _spec_run_vector()
    check("run", value)
    for key, bad in [("retryOf", "not-a-run"), ("retryOf", 7), ("requestedModel", None), ("baseUrl", 3),
                     ("usage", {"inputTokens": 1, "outputTokens": 2}), ("usage", {"inputTokens": "1", "outputTokens": 2,
                                                                                   "turns": 1}),
                     ("usage", None), ("turnUsage", {"inputTokens": 1, "outputTokens": 2}),
                     ("turnUsage", {"turn": 1, "inputTokens": 1, "outputTokens": 2, "cachedTokens": -1}),
                     ("turnUsage", [1])]:
        with pytest.raises(SchemaViolation):
            check("run", {**value, key: bad})
    check("run", {**value, "turnUsage": None, "baseUrl": None})
    without = {k: v for k, v in value.items() if k not in ("requestedModel", "baseUrl", "retryOf", "usage", "turnUsage")}
    check("run", without)
