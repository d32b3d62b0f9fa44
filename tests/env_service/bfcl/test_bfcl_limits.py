"""Every tool call holds its time budget, on the main thread and off it, and results are capped.

The slow calls here are BFCL's own functions with valid arguments that make them run in C code for
minutes (``decimal``, big integers, ``mpmath``); before the argument bounds each of these tests ran
until its own alarm fired.
"""

from __future__ import annotations

import threading
import time

import pytest

from env_service.bfcl.episode import BfclEpisode
from env_service.bfcl.executor import Executor
from env_service.bfcl.limits import CallTimeout, time_budget
from env_service.kit.episode import truncate

SLOW_VALID_CALLS = [
    "square_root(number=2, precision=10000000)",
    "logarithm(value=7, base=3, precision=1000000)",
    "power(base=10, exponent=1000000000)",
    "power(10, 100000000)",
    "round_number(number=5, decimal_places=-1000000000000000)",
]


def _math_executor(store, **kw) -> Executor:
    task = next(t for t in (store.get(i) for i in store.ids()) if "MathAPI" in t.involved_classes)
    return Executor(task.involved_classes, task.entry["initial_config"], task.long_context, **kw)


def _in_thread(fn):
    """Run ``fn`` on a non-main thread (as the in-process service does) and return its value."""
    out: list = []
    worker = threading.Thread(target=lambda: out.append(fn()))
    worker.start()
    worker.join(timeout=30)
    assert not worker.is_alive(), "the call did not return within 30 s"
    return out[0]


@pytest.mark.parametrize("thread", ["main", "other"])
@pytest.mark.parametrize("call", SLOW_VALID_CALLS)
def test_slow_valid_math_calls_answer_within_the_budget(store, call, thread):
    ex = _math_executor(store, call_timeout_s=0.5)
    t0 = time.perf_counter()
    (res,) = ex.run([call]) if thread == "main" else _in_thread(lambda: ex.run([call]))
    assert time.perf_counter() - t0 < 1.0, call
    assert res.error == "limit" and res.text.startswith("Error during execution: ") and "\n" not in res.text


def test_bounds_leave_ordinary_calls_alone(store):
    ex = _math_executor(store)
    texts = ex.execute(["square_root(number=16, precision=5)", "power(base=2, exponent=10)",
                        "logarithm(value=8, base=2, precision=10)", "round_number(number=1234, decimal_places=-2)"])
    assert texts[0] == "{'result': Decimal('4')}" and texts[1] == '{"result": 1024}'
    assert texts[2].startswith("{'result': mpf('3.0") and texts[3] == '{"result": 1200}'


def test_time_budget_interrupts_python_work_off_the_main_thread():
    def spin() -> str:
        try:
            with time_budget(0.2):
                while True:
                    pass
        except CallTimeout:
            return "interrupted"
        return "finished"

    t0 = time.perf_counter()
    assert _in_thread(spin) == "interrupted"
    assert time.perf_counter() - t0 < 2.0


def test_an_expired_budget_never_lands_after_the_call():
    """Calls that finish right at their deadline must not leave an interrupt pending in the thread."""
    def many() -> int:
        done = 0
        for _ in range(40):
            try:
                with time_budget(0.05):
                    time.sleep(0.05)
            except CallTimeout:
                pass
            done += 1
            time.sleep(0.06)  # an interrupt left pending would land here, outside any handler
        return done

    assert _in_thread(many) == 40


def test_executor_budget_holds_off_the_main_thread(store):
    ex = Executor(["GorillaFileSystem"], {}, False, call_timeout_s=0.2)

    def spin(**kwargs):
        while True:
            pass

    ex._methods["pwd"] = ("GorillaFileSystem", spin)
    (res,) = _in_thread(lambda: ex.run(["pwd()"]))
    assert res.error == "timeout" and res.text == "Error during execution: call exceeded its time budget of 0.2 s"


def test_truncate_marks_the_cut():
    assert truncate("abc", 3, "x", "p") == "abc"
    cut = truncate("a" * 10, 4, "a tool result", "max_tool_result_chars")
    assert cut.startswith("aaaa\n[truncated: a tool result had 10 characters; shown 4")
    assert "max_tool_result_chars" in cut


def test_tool_results_and_observations_are_capped(store, inert):
    task = store.get("multi_turn_base_0")
    ep = BfclEpisode(task, {"max_tool_result_chars": 1024, "max_observation_chars": 4096}, interface=inert)
    call = '<tool_call>{"name": "echo", "arguments": {"content": "%s"}}</tool_call>' % ("x" * 30000)
    out = ep.step(call * 20)
    assert len(out.observation) < 4096 + 200
    assert "[truncated: a tool result had" in out.observation
    assert "[truncated: the observation had" in out.observation


def test_default_caps_bound_the_amplification(store, inert):
    """A 0.9 MB message once produced a 360 MB answer (every call echoing the whole input back)."""
    task = store.get("multi_turn_base_0")
    ep = BfclEpisode(task, {}, interface=inert)
    call = '<tool_call>{"name": "echo", "arguments": {"content": "%s"}}</tool_call>' % ("y" * 30000)
    message = call * 30
    out = ep.step(message)
    assert len(message) > 900_000 and len(out.observation) < 300_000


def test_a_message_of_slow_calls_stops_at_the_step_budget(store, inert, monkeypatch):
    """Calls left when the step's budget is spent are refused, not run and not replayed by the checker."""
    import env_service.kit.episode as episode_mod

    monkeypatch.setattr(episode_mod, "STEP_TIME_BUDGET_S", 0.3)
    ep = BfclEpisode(store.get("multi_turn_base_0"), {}, interface=inert)
    ep.executor.call_timeout_s = 0.2

    def spin(**kwargs):
        while True:
            pass

    ep.executor._methods["pwd"] = ("GorillaFileSystem", spin)
    call = '<tool_call>{"name": "pwd", "arguments": {}}</tool_call>'
    t0 = time.perf_counter()
    out = ep.step(call * 10)
    assert time.perf_counter() - t0 < 2.0
    assert out.observation.count("time budget of 0.2 s") == 2
    assert out.observation.count("not run: the calls of this message used up") == 8
    assert ep.model_turns[0] == [["pwd()", "pwd()"]]
