"""Hostile and faulty use of the service over real HTTP: well over 1,000 distinct tool calls and requests.

What must hold for every one of them: nothing the model or a client wrote is executed (every payload
that could run code tries to create a sentinel file, which must never appear); no answer is a 5xx;
every error answer is JSON with a one-line ``detail`` and no traceback; an oracle episode running on
another connection meanwhile completes with reward 1.0; the service keeps answering ``/healthz``.

Instance ids are capabilities (random, 128 bits): a client that holds another episode's id can drive
it, as in the release. What is tested here is that ids nobody handed out, released ids and ids of
the wrong shape reach nothing.
"""

from __future__ import annotations

import json
import random
import re
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from env_service.bfcl.episode import BfclEpisode
from env_service.bfcl.executor import MULTI_TURN_CLASSES, backend_class
from env_service.bfcl.tasks import default_store
from live_service import running_service

MAX_INSTANCES = 120
NEIGHBOUR_TASKS = ["multi_turn_base_0", "multi_turn_base_15", "multi_turn_miss_param_5", "multi_turn_long_context_3"]
ERROR_MARKERS = ("[ERROR] Invalid tool call format", "Error during execution")


@pytest.fixture(scope="module")
def service() -> Iterator[str]:
    with running_service("--max-instances", str(MAX_INSTANCES), workers=2) as (url, _):
        yield url


@pytest.fixture()
def sentinel(tmp_path: Path) -> Path:
    return tmp_path / "EXECUTED"


def check_answer(resp: httpx.Response, *, overload: bool = False) -> dict:
    """No 5xx, JSON, a one-line detail on errors, never a traceback. ``overload``: the instance cap's
    503 is allowed (the documented "retry later" answer, which the release's client retries)."""
    if overload and resp.status_code == 503:
        assert resp.json()["error"]["code"] == "unavailable" and "instance cap reached" in resp.json()["detail"]
    else:
        assert resp.status_code < 500, (resp.status_code, resp.text[:300])
    assert "Traceback" not in resp.text and 'File "' not in resp.text, resp.text[:300]
    body = resp.json()
    if resp.status_code >= 400:
        assert body["success"] is False and "\n" not in body["detail"] and body["error"]["code"], body
    return body


def create_retrying(http: httpx.Client, task_id: str, patience_s: float = 60.0) -> str:
    """``/v1/create``, waiting out the instance cap's 503 as a well-behaved client does."""
    deadline = time.monotonic() + patience_s
    while True:
        resp = http.post("/v1/create", json={"task_id": task_id})
        if resp.status_code != 503 or time.monotonic() > deadline:
            return resp.json()["instance_id"]
        time.sleep(0.2)


@contextmanager
def healthy_neighbour(url: str) -> Iterator[None]:
    """Oracle episodes on their own connection for as long as the block runs; all must score 1.0."""
    stop = threading.Event()
    scores: list[float] = []
    failures: list[str] = []
    store = default_store()

    def run() -> None:
        with httpx.Client(base_url=url, timeout=60) as http:
            k = 0
            while not stop.is_set() or not scores:
                task = store.get(NEIGHBOUR_TASKS[k % len(NEIGHBOUR_TASKS)])
                k += 1
                try:
                    iid = create_retrying(http, task.id)
                    for content in BfclEpisode.oracle(task):
                        http.post("/v1/step", json={"instance_id": iid, "content": content}).raise_for_status()
                    scores.append(http.post("/v1/evaluate", json={"instance_id": iid, "sparse": True}).json()["score"])
                    http.post("/v1/release", json={"instance_id": iid})
                except (httpx.HTTPError, KeyError, ValueError) as err:
                    failures.append(f"{task.id}: {type(err).__name__}: {err}")
                    return

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    try:
        yield
    finally:
        stop.set()
        worker.join(timeout=120)
    assert not failures, failures
    assert scores and all(s == 1.0 for s in scores), scores


def responsive(http: httpx.Client) -> None:
    t0 = time.perf_counter()
    assert http.get("/healthz").text == "OK"
    assert time.perf_counter() - t0 < 5.0


# --------------------------------------------------------------------------- hostile tool calls


def code_payloads(marker: Path) -> list[str]:
    """Expressions that would create ``marker`` (or worse) if anything evaluated them."""
    m = str(marker)
    write = f"__import__('pathlib').Path({m!r}).write_text('x')"
    runs = [write, f"open({m!r}, 'w').write('x')", f"exec(\"open({m!r}, 'w')\")", f"eval(\"open({m!r}, 'w')\")",
            f"__import__('os').system('touch {m}')", f"__import__('subprocess').run(['touch', {m!r}])",
            f"compile({write!r}, 's', 'exec')", f"globals()['__builtins__'].open({m!r}, 'w')"]
    wrappers = ["{}", "ls(a={})", "cd(folder={})", "echo(content={}, file_name='x')", "ls(a=[{}])", "ls(a=({},))",
                "ls(a={{'k': {}}})", "ls(a=(lambda: {})())", "ls(a=[{} for _ in [1]])", "ls(a={{{} for _ in [1]}})",
                "ls(a={{k: {} for k in [1]}})", "ls(a=({} for _ in [1]))", "ls(a=f'{{{}}}')", "ls(*[{}])",
                "ls(**{{'a': {}}})", "ls(a=(x := {}))", "ls(a={} if True else 1)", "ls(a=[1, 2][{}])",
                "ls(a=1 + {})", "ls(a=not {})", "ls().__class__({})", "ls({})", "[{}]"]
    out = [w.format(r) for w in wrappers for r in runs]
    out += ["import os", "from os import system", "import os; os.system('x')", "ls(); pwd()", "ls()\npwd()",
            "await ls()", "lambda: ls()", "ls(a=9**9**9)", "ls(a=10**10**10)", "ls(a=2**64**8)", "ls(a=(1).__class__)",
            "ls(a=globals())", "ls(a=__builtins__)", "ls(a=ls())", "ls(a={1, ls()})", "ls()[0]", "ls().keys()",
            "cd.__func__.__globals__", "ls.__self__._load_scenario({})", "().__class__.__bases__[0].__subclasses__()",
            "breakpoint()", "input()", "help()", "exit()", "quit()", "kill()", "getattr(ls, '__globals__')",
            "type('X', (), {})", "vars()", "dir()", "super()", "memoryview(b'x')", "ls(a=" + "[" * 300 + "]" * 300 + ")",
            "ls(a=" + "9" * 5000 + ")", "ls(a='x' * 10**9)", "ls(a=chr(0))", "ls\x00()", "l\u0455()",
            "ls(a=b'\\x00' * 10**9)", "ls(a=1j ** 10**9)"]
    return out


def private_names() -> list[str]:
    """Every private and dunder attribute of the 8 backend classes (``_load_scenario``, ``__class__``...)."""
    names: set[str] = set()
    for class_name in MULTI_TURN_CLASSES:
        names |= {n for n in dir(backend_class(class_name)) if n.startswith("_")}
    return sorted(names)


def hostile_messages(marker: Path) -> list[tuple[str, str]]:
    """``(parser mode, assistant message)`` pairs, all distinct, every one of which must fail."""
    msgs: list[tuple[str, str]] = []
    payloads = code_payloads(marker)
    for p in payloads:
        # python_list reads text without call syntax as plain talk (the turn advances): calls only.
        if re.fullmatch(r"[A-Za-z_]\w*\(.*\)", p, re.DOTALL):
            msgs.append(("python_list", p))
        if "(" in p:
            msgs.append(("python_list", f"[{p}]"))
        msgs.append(("xml_json", "<tool_call>" + json.dumps({"name": p, "arguments": {}}) + "</tool_call>"))
    for name in private_names():
        msgs.append(("python_list", f"[{name}()]"))
        msgs.append(("xml_json", "<tool_call>" + json.dumps({"name": name, "arguments": {}}) + "</tool_call>"))
        for class_name in MULTI_TURN_CLASSES[:3]:
            msgs.append(("python_list", f"[{class_name}.{name}()]"))
    for class_name in MULTI_TURN_CLASSES:
        msgs.append(("python_list", f"[{class_name}()]"))
        msgs.append(("xml_json", "<tool_call>" + json.dumps({"name": f"{class_name}.ls", "arguments": {}}) + "</tool_call>"))
    for key in [f"a) or {code_payloads(marker)[0]} or (", "a=1, b", "**kw", "*args", "__class__", "a b", "", "1a",
                "a\x00", "lambda", "import", "a.b", "a[0]", "a)(", "folder='x'); __import__('os').system('x') #"]:
        msgs.append(("xml_json", "<tool_call>" + json.dumps({"name": "cd", "arguments": {key: "x"}}) + "</tool_call>"))
    depth_cases = [("[", "]"), ('{"a":', "}")]
    for depth in (201, 500, 990, 5000, 100_000):
        for open_, close in depth_cases:
            args = '{"folder": ' + open_ * depth + ("1" if open_ == '{"a":' else "") + close * depth + "}"
            msgs.append(("xml_json", '<tool_call>{"name": "cd", "arguments": ' + args + "}</tool_call>"))
    for digits in (4301, 5000, 100_000):
        msgs.append(("xml_json", '<tool_call>{"name": "cd", "arguments": {"folder": ' + "9" * digits + "}}</tool_call>"))
        msgs.append(("xml_json", '<tool_call>{"name": "cd", "arguments": "{\\"folder\\": ' + "9" * digits + '}"}</tool_call>'))
    for bad in ["<tool_call>{oops</tool_call>", "<tool_call>", "</tool_call>", "<tool_call>[1]</tool_call>x<tool_call>",
                "<tool_call>{\"name\": \"cd\"}</tool_call>", "<tool_call>{\"name\": 1, \"arguments\": {}}</tool_call>",
                "<tool_call>{\"name\": \"cd\", \"arguments\": 5}</tool_call>", "<tool_call>{\"name\": \"cd\\u0000\", \"arguments\": {}}</tool_call>",
                "<tool_call>{\"name\": \"cd\", \"arguments\": {\"folder\": NaN}}</tool_call>x<tool_call>{}"]:
        msgs.append(("xml_json", bad))
    return list(dict.fromkeys(msgs))


def test_hostile_tool_calls_execute_nothing(service: str, sentinel: Path) -> None:
    messages = hostile_messages(sentinel)
    assert len(messages) >= 700, len(messages)
    params = {"max_steps_per_turn": 1_000_000, "enforce_available_tools": False}
    with healthy_neighbour(service), httpx.Client(base_url=service, timeout=60) as http:
        ids = {}
        for mode in ("python_list", "xml_json"):
            body = {"task_id": "multi_turn_base_0", "params": {**params, "tool_call_parser": mode}}
            ids[mode] = check_answer(http.post("/v1/create", json=body))["instance_id"]
        for k, (mode, content) in enumerate(messages):
            out = check_answer(http.post("/v1/step", json={"instance_id": ids[mode], "content": content}))
            assert out["terminated"] is False, content[:200]
            assert any(m in out["observation"]["content"] for m in ERROR_MARKERS), (content[:200], out)
            if k % 100 == 0:
                responsive(http)
                assert not sentinel.exists(), content[:200]
        for iid in ids.values():  # the checker replays every accepted call: still nothing runs
            check_answer(http.post("/v1/evaluate", json={"instance_id": iid}))
    assert not sentinel.exists()


def test_injection_in_argument_values_stays_data(service: str, sentinel: Path) -> None:
    """Code in string arguments reaches the real tool as a string: the file system sees odd names."""
    values = [p for p in code_payloads(sentinel)[:120]] + ["'); " + p + " #" for p in code_payloads(sentinel)[:40]]
    with httpx.Client(base_url=service, timeout=60) as http:
        iid = check_answer(http.post("/v1/create", json={"task_id": "multi_turn_base_0",
                                                         "params": {"max_steps_per_turn": 1_000_000}}))["instance_id"]
        for value in values:
            for tool, key in (("cd", "folder"), ("cat", "file_name")):
                content = "<tool_call>" + json.dumps({"name": tool, "arguments": {key: value}}) + "</tool_call>"
                out = check_answer(http.post("/v1/step", json={"instance_id": iid, "content": content}))
                assert out["observation"]["content"].startswith('<tool_response>\n{"error": "'), out
    assert not sentinel.exists()


# --------------------------------------------------------------------------- slow, large, deep


def test_slow_valid_calls_answer_within_their_budget(service: str) -> None:
    calls = [("square_root", {"number": 2, "precision": 10**7}), ("power", {"base": 10, "exponent": 10**9}),
             ("logarithm", {"value": 7, "base": 3, "precision": 10**6}),
             ("round_number", {"number": 5, "decimal_places": -(10**15)})]
    with httpx.Client(base_url=service, timeout=60) as http:
        iid = check_answer(http.post("/v1/create", json={"task_id": "multi_turn_base_15"}))["instance_id"]
        for name, args in calls:
            content = "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"
            t0 = time.perf_counter()
            out = check_answer(http.post("/v1/step", json={"instance_id": iid, "content": content}))
            assert time.perf_counter() - t0 < 3.0, name
            assert "this environment's limit" in out["observation"]["content"], out
        assert http.get("/metrics").json()["worker_restarts"] == 0


def test_output_amplification_is_capped(service: str) -> None:
    """About 0.9 MB of `ls` calls in a long-context task once answered with hundreds of MB."""
    call = '<tool_call>{"name": "ls", "arguments": {"a": true}}</tool_call>'
    message = call * (900_000 // len(call))
    with httpx.Client(base_url=service, timeout=120) as http:
        iid = check_answer(http.post("/v1/create", json={"task_id": "multi_turn_long_context_0"}))["instance_id"]
        resp = http.post("/v1/step", json={"instance_id": iid, "content": message})
        out = check_answer(resp)
        assert len(resp.content) < 600_000, len(resp.content)
        assert "[truncated: the observation had" in out["observation"]["content"]


def test_deep_json_and_huge_numbers_in_a_tool_call_are_tool_format_errors(service: str) -> None:
    with httpx.Client(base_url=service, timeout=60) as http:
        iid = check_answer(http.post("/v1/create", json={"task_id": "multi_turn_base_0"}))["instance_id"]
        for args in ('{"folder": ' + "[" * 990 + "]" * 990 + "}", '{"folder": ' + "9" * 5000 + "}"):
            content = '<tool_call>{"name": "cd", "arguments": ' + args + "}</tool_call>"
            out = check_answer(http.post("/v1/step", json={"instance_id": iid, "content": content}))
            first = out["observation"]["content"].splitlines()[0]
            assert first.startswith("[ERROR] Invalid tool call format: "), first
            # The release route answers the same way.
            release = check_answer(http.post("/step", json={"env_type": "default", "instance_id": iid,
                                                            "messages": {"role": "assistant", "content": content}}))
            assert release["data"]["state"][0]["content"].splitlines()[0] == first


# --------------------------------------------------------------------------- hostile requests


ROUTES = ["/create", "/step", "/evaluate", "/get_info", "/release", "/get_env_profile",
          "/v1/create", "/v1/step", "/v1/evaluate", "/v1/release", "/v1/info", "/v1/profile"]
JUNK_VALUES = [None, True, 1, -1, 1.5, "x", "", [], [1], {}, {"a": 1}, "\x00", "9" * 300, ["\x00"] * 3, 10**30]


def malformed_requests() -> list[tuple[str, str, bytes, str]]:
    """``(method, path, body, content type)``, all distinct."""
    out: list[tuple[str, str, bytes, str]] = []
    raw_bodies = [b"", b"{", b"}", b"[]", b"null", b"1", b'"x"', b"\xff\xfe{", b"\x00", b'{"a": NaN}',
                  b'{"task_id": "multi_turn_base_0", "task_id": 1}', b"[" * 990 + b"]" * 990,
                  b"[" * 100_000, b'{"params": ' + b"9" * 5000 + b"}", b"\xef\xbb\xbf{}", b"{" + b" " * 50_000 + b"}",
                  b'{"instance_id": "\\ud800"}', b'{"env_type": "bfcl", "task_id": "\\u0000"}']
    for route in ROUTES:
        for body in raw_bodies:
            out.append(("POST", route, body, "application/json"))
        for field in ("env_type", "task_id", "instance_id", "messages", "params", "content", "sparse", "split"):
            for value in JUNK_VALUES:
                out.append(("POST", route, json.dumps({field: value}).encode(), "application/json"))
        for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
                      "application/xml", "", "application/json; charset=latin-1"):
            out.append(("POST", route, b"task_id=multi_turn_base_0", ctype))
        for method in ("GET", "PUT", "DELETE", "PATCH"):
            out.append((method, route, b"{}", "application/json"))
    for path in ("/nope", "/v2/step", "/../etc/passwd", "/%00", "/step%2F..", "/" + "a" * 5000, "/create/x", "///"):
        out.append(("POST", path, b"{}", "application/json"))
    return out


def test_malformed_requests_get_one_line_4xx(service: str) -> None:
    cases = malformed_requests()
    assert len(set(cases)) == len(cases) >= 600, len(cases)
    with healthy_neighbour(service), httpx.Client(base_url=service, timeout=60) as http:
        for k, (method, path, body, ctype) in enumerate(cases):
            headers = {"content-type": ctype} if ctype else {}
            resp = http.request(method, path, content=body, headers=headers)
            check_answer(resp)
            if k % 100 == 0:
                responsive(http)
        metrics = http.get("/metrics").json()
    assert metrics["errors_total"].get("internal", 0) == 0, metrics["errors_total"]


PARAM_KEYS = ["strict_tool_parser", "tool_call_parser", "max_steps_per_turn", "observation_lite",
              "tool_feedback_evolution", "diagnostic_evolution", "tool_prompt_mode", "is_open_query",
              "max_tool_result_chars", "max_observation_chars", "rollout_mode", "nope"]
BLOCK_KEYS = ["enable", "categories", "instruction", "max_tool_names", "guidelines", "max_lines", "lines",
              "apply_to_validation", "x"]


def random_value(rng: random.Random, depth: int = 0) -> object:
    """A JSON value of any shape: scalars of every type, and lists / interface-like blocks nested a little."""
    kind = rng.randrange(8 if depth < 2 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return rng.random() < 0.5
    if kind == 2:
        return rng.choice([0, 1, -1, 2**31, -(2**63), 10**30, rng.randrange(-1000, 1000)])
    if kind == 3:
        return rng.choice([0.0, -0.5, 1e308, 3.25, rng.uniform(-1e6, 1e6)])
    if kind in (4, 5):
        return "".join(rng.choice("ab_ \x00\u00e9{}[]\"'") for _ in range(rng.randrange(9)))
    if kind == 6:
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {rng.choice(BLOCK_KEYS): random_value(rng, depth + 1) for _ in range(rng.randrange(4))}


def fuzzed_create_params(count: int = 150, seed: int = 1234) -> list[dict]:
    # A seeded generator of our own rather than a property-testing engine: the same 150 cases on
    # every run and machine, and a run time bounded by the case count.
    rng = random.Random(seed)
    return [{rng.choice(PARAM_KEYS): random_value(rng) for _ in range(rng.randrange(5))} for _ in range(count)]


@pytest.mark.parametrize("params", fuzzed_create_params(), ids=lambda p: "-".join(sorted(p)) or "empty")
def test_create_params_of_any_shape_get_200_or_one_line_4xx(service: str, params: dict) -> None:
    with httpx.Client(base_url=service, timeout=60) as http:
        resp = http.post("/create", json={"env_type": "bfcl", "task_id": "multi_turn_base_0", "params": params})
        body = check_answer(resp)
        if resp.status_code == 200:
            http.post("/release", json={"instance_id": body["data"]["info"]["instance_id"]})
        else:
            assert resp.status_code == 400, (params, body)


def test_ids_nobody_handed_out_and_released_ids_reach_nothing(service: str) -> None:
    with httpx.Client(base_url=service, timeout=60) as http:
        live = check_answer(http.post("/v1/create", json={"task_id": "multi_turn_base_0"}))["instance_id"]
        gone = check_answer(http.post("/v1/create", json={"task_id": "multi_turn_base_1"}))["instance_id"]
        assert check_answer(http.post("/v1/release", json={"instance_id": gone}))["released"] is True
        guesses = [live[:-1] + ("0" if live[-1] != "0" else "1"), live.upper(), live + " ", " " + live, "inst_0",
                   "inst_" + "0" * 32, "0", "*", "%", "../" + live, "x" * 201, "x" * 10_000, "\x00", live + "\x00",
                   "é", "\u202e" + live, "null", "None", "", gone]
        for iid in guesses:
            for route, extra in (("/step", {"messages": {"role": "assistant", "content": "ls"}}), ("/evaluate", {}),
                                 ("/get_info", {}), ("/release", {})):
                resp = http.post(route, json={"env_type": "default", "instance_id": iid, **extra})
                body = check_answer(resp)
                if route == "/release":
                    assert body["success"] is False
                else:
                    assert resp.status_code in (400, 404), (iid, resp.text)
        assert http.post("/v1/info", json={"instance_id": live}).json()["info"]["turn"] == 0  # untouched
        detail = http.post("/v1/step", json={"instance_id": gone, "content": "x"}).json()["detail"]
        assert "was released" in detail


def test_concurrent_release_and_step(service: str) -> None:
    with httpx.Client(base_url=service, timeout=60, limits=httpx.Limits(max_connections=16)) as http:
        ids = [check_answer(http.post("/v1/create", json={"task_id": "multi_turn_base_2"}))["instance_id"]
               for _ in range(24)]

        def hit(job: tuple[str, str]) -> int:
            route, iid = job
            body = {"instance_id": iid, "content": '<tool_call>{"name": "ls", "arguments": {}}</tool_call>'} \
                if route == "/v1/step" else {"instance_id": iid}
            resp = http.post(route, json=body)
            check_answer(resp)
            return resp.status_code

        jobs = [(route, iid) for iid in ids for route in ("/v1/step", "/v1/release", "/v1/step", "/v1/evaluate")]
        with ThreadPoolExecutor(max_workers=12) as pool:
            statuses = list(pool.map(hit, jobs))
        assert set(statuses) <= {200, 404}
        assert http.get("/metrics").json()["instances_live"] <= MAX_INSTANCES


def test_create_flood_past_the_cap(service: str) -> None:
    with healthy_neighbour(service), httpx.Client(base_url=service, timeout=60,
                                                  limits=httpx.Limits(max_connections=16)) as http:
        def create(k: int) -> httpx.Response:
            return http.post("/create", json={"env_type": "bfcl", "task_id": "multi_turn_base_3",
                                              "instance_id": f"flood-{k}"})

        with ThreadPoolExecutor(max_workers=12) as pool:
            answers = list(pool.map(create, range(MAX_INSTANCES + 40)))
        for resp in answers:
            check_answer(resp, overload=True)
        refused = [r for r in answers if r.status_code == 503]
        assert len(refused) >= 40 and all("instance cap reached" in r.json()["detail"] for r in refused)
        for k, resp in enumerate(answers):
            if resp.status_code == 200:
                http.post("/release", json={"instance_id": f"flood-{k}"})
        assert check_answer(create(10_000))["success"] is True  # room again
        http.post("/release", json={"instance_id": "flood-10000"})


def test_oversized_and_chunked_bodies_are_refused_with_json(service: str) -> None:
    ten_mb = "x" * 10_000_000
    with httpx.Client(base_url=service, timeout=60) as http:
        iid = check_answer(http.post("/v1/create", json={"task_id": "multi_turn_base_0"}))["instance_id"]
        declared = http.post("/v1/step", json={"instance_id": iid, "content": ten_mb})
        assert declared.status_code == 413 and check_answer(declared)["error"]["code"] == "too_large"
        payload = json.dumps({"instance_id": iid, "content": ten_mb}).encode()

        def chunks() -> Iterator[bytes]:  # no content-length: transfer-encoding chunked
            for i in range(0, len(payload), 65536):
                yield payload[i:i + 65536]

        chunked = http.post("/v1/step", content=chunks(), headers={"content-type": "application/json"})
        assert chunked.status_code == 413, chunked.text[:200]
        assert check_answer(chunked)["error"]["code"] == "too_large"
        small = json.dumps({"instance_id": iid, "content": "hello"}).encode()
        ok = http.post("/v1/step", content=iter([small[:10], small[10:]]), headers={"content-type": "application/json"})
        assert ok.status_code == 200  # chunked bodies under the limit still work
        responsive(http)


def test_garbage_on_the_socket_leaves_the_service_serving(service: str) -> None:
    """Bytes that are not HTTP are answered by uvicorn itself (plain text 400), never by a crash."""
    host, port = service.removeprefix("http://").split(":")
    for junk in (b"GARBAGE\r\n\r\n", b"POST /create HTTP/1.1\r\nContent-Length: -5\r\n\r\n", b"\x00" * 1000,
                 b"POST /create HTTP/1.1\r\nHost: x\r\n" + b"X: " + b"y" * 70_000 + b"\r\n\r\n"):
        with socket.create_connection((host, int(port)), timeout=10) as conn:
            conn.sendall(junk)
            try:
                answer = conn.recv(4096)
            except (ConnectionResetError, TimeoutError):
                answer = b""
        assert not answer or answer.startswith(b"HTTP/1.1 4"), answer[:100]
    with httpx.Client(base_url=service, timeout=10) as http:
        responsive(http)


def test_in_process_client_holds_the_budget_too() -> None:
    """No worker, no main thread: ``power(10, 10**9)`` once ran for more than 290 s here."""
    from env_service.client import EnvClient

    with EnvClient.in_process() as client:
        episode = client.create("multi_turn_base_15")
        for name, args in (("power", {"base": 10, "exponent": 10**9}),
                           ("square_root", {"number": 2, "precision": 10**7})):
            t0 = time.perf_counter()
            out = client.step(episode.instance_id, "<tool_call>" + json.dumps({"name": name, "arguments": args})
                              + "</tool_call>")
            assert time.perf_counter() - t0 < 3.0 and "this environment's limit" in out.observation
