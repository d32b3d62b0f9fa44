"""The safe executor: parsing, BFCL's result-string rules, limits, isolation."""

from __future__ import annotations

import json
import threading

import pytest

from env_service.bfcl.executor import BLOCKED_NAMES, Executor, format_result
from env_service.kit import CallParseError, ParsedCall, parse_call
from env_service.bfcl.limits import CallTimeout, time_budget


def _executor(store, tid="multi_turn_base_0", **kw) -> Executor:
    task = store.get(tid)
    return Executor(task.involved_classes, task.entry["initial_config"], task.long_context, **kw)


# ----- parse_call ------------------------------------------------------------------------------
def test_parse_call_literals_positional_and_negative_numbers():
    p = parse_call("f('a', 2, x=-3.5, y=[1, {'k': (True, None)}], z=+4)")
    assert p == ParsedCall("f", ("a", 2), {"x": -3.5, "y": [1, {"k": (True, None)}], "z": 4})


@pytest.mark.parametrize("text, fragment", [
    ("x.f()", "bare function name"),
    ("_private()", "starting with '_'"),
    ("f(a=b)", "Name"),
    ("f(a=1+2)", "BinOp"),
    ("f(*xs)", "unpacking"),
    ("f(**kw)", "unpacking"),
    ("f(a=-'x')", "sign may precede a number"),
    ("f", "expected a function call"),
    ("f(a=1)(b=2)", "bare function name"),
    ("f(a=", "<string>"),
])
def test_parse_call_rejects(text, fragment):
    with pytest.raises(CallParseError, match=None) as err:
        parse_call(text)
    assert fragment in str(err.value)


def test_parse_call_limits():
    with pytest.raises(CallParseError, match="too long"):
        parse_call("f(a='" + "x" * 40_000 + "')")
    with pytest.raises(CallParseError, match="too large"):
        parse_call(f"f(a={2**60})")
    assert parse_call(f"f(a={2**53})").kwargs["a"] == 2**53


def test_bind_maps_positional_arguments_like_python():
    def sort(file_name: str, reverse: bool = False) -> None: ...
    assert parse_call("sort('r.txt', reverse=True)").bind(sort) == {"file_name": "r.txt", "reverse": True}


# ----- result strings --------------------------------------------------------------------------
def test_format_result_rules():
    assert format_result("as is") == "as is"
    assert format_result({"a": 1, "b": "é"}) == json.dumps({"a": 1, "b": "é"})
    assert format_result(None) == "None"
    assert format_result(["A", "B"]) == "['A', 'B']"
    unserialisable = {"x": object()}
    assert format_result(unserialisable) == str(unserialisable)

    class Sub(dict):
        pass

    assert format_result(Sub(a=1)) == "{'a': 1}"  # only an exact dict goes through json.dumps


def test_executor_results_match_bfcl_rules(store):
    ex = _executor(store)
    assert ex.execute(["pwd()"]) == [json.dumps({"current_working_directory": "/workspace"})]
    out = ex.execute(["cd(folder='document')", "mkdir(dir_name='t')", "ls()"])
    assert out[1] == "None"
    assert "'t'" in out[2] or '"t"' in out[2]
    # Positional arguments reach the parameter Python would bind them to.
    keyword = _executor(store).execute(["cd(folder='document')", "sort(file_name='final_report.pdf')"])
    positional = _executor(store).execute(["cd('document')", "sort('final_report.pdf')"])
    assert positional == keyword and not positional[1].startswith("Error")


def test_executor_error_strings(store):
    ex = _executor(store)
    for name in sorted(BLOCKED_NAMES):
        assert ex.execute([f"{name}()"]) == [f"Error during execution: Function call {name} is not allowed."]
    assert ex.execute(["no_such_tool()"]) == ["Error during execution: name 'no_such_tool' is not defined"]
    (msg,) = ex.execute(["cd(nope=1)"])
    assert msg.startswith("Error during execution: ") and "unexpected keyword argument 'nope'" in msg
    (msg,) = ex.execute(["cd(folder='x"])
    assert msg.startswith("Error during execution: ") and "(<string>, line 1)" in msg
    assert [r.error for r in ex.run(["kill()", "nope()", "cd(", "cd(nope=1)", "pwd()"])] == \
        ["blocked", "unknown", "parse", "exception", None]


def test_method_table_is_public_methods_of_this_episode_only(store):
    ex = _executor(store)  # TwitterAPI + GorillaFileSystem
    names = set(ex.method_names)
    assert {"cd", "ls", "post_tweet"} <= names
    assert not any(n.startswith("_") for n in names)
    assert "get_stock_info" not in names  # TradingBot is not involved
    assert list(ex.instances) == list(store.get("multi_turn_base_0").involved_classes)


def test_time_budget_interrupts_python_level_work():
    with pytest.raises(CallTimeout):
        with time_budget(0.05):
            while True:
                pass


def test_executor_reports_timeouts(store):
    ex = _executor(store, call_timeout_s=0.05)

    def spin(**kwargs):
        while True:
            pass

    ex._methods["pwd"] = ("GorillaFileSystem", spin)
    (res,) = ex.run(["pwd()"])
    assert res.error == "timeout" and "time budget" in res.text


def test_instances_are_fresh_and_module_defaults_untouched(store):
    from bfcl_eval.eval_checker.multi_turn_eval.func_source_code import gorilla_file_system as gfs

    before = repr(gfs.DEFAULT_STATE)
    a, b = _executor(store), _executor(store)
    a.execute(["cd(folder='document')", "touch(file_name='only_in_a.txt')"])
    assert "only_in_a.txt" in a.execute(["ls()"])[0]
    assert "only_in_a.txt" not in b.execute(["cd(folder='document')", "ls()"])[1]
    assert a.instances["GorillaFileSystem"] is not b.instances["GorillaFileSystem"]
    assert repr(gfs.DEFAULT_STATE) == before


def test_long_context_weather_results_are_per_episode_under_threads(store):
    tid = next(t for t in store.ids(category="multi_turn_long_context")
               if "VehicleControlAPI" in store.get(t).involved_classes)
    n = 300

    def run(executor, out):
        out.extend(executor.execute(["get_outside_temperature_from_google()"] * n))

    expected: list[str] = []
    run(_executor(store, tid), expected)
    outs: list[list[str]] = [[], []]
    threads = [threading.Thread(target=run, args=(_executor(store, tid), outs[i])) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outs[0] == expected and outs[1] == expected
    assert len(set(expected)) > 1  # the values really change call by call
