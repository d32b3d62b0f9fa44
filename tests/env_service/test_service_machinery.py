"""Service machinery with a scripted test double of the episode: routing, errors, cap, reaper, workers.

The double makes failures easy to provoke (an episode that raises, a worker that hangs); the BFCL
episode itself is exercised over real HTTP in ``test_http_service.py``.
"""

from __future__ import annotations

import os
import signal
import time
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient

from env_service.app import create_app
from env_service.client import EnvClient, EnvServiceError, EnvUnavailableError
from env_service.host import EpisodeHost, OpError
from env_service.service import ServiceConfig

SELF = f"{__name__}:scripted_host"  # importable by the spawned worker processes too


class ScriptedEpisode:
    """``done`` ends the episode, ``raise`` raises, ``hang`` blocks, ``bad`` raises ValueError."""

    def __init__(self, task_id: str, params: dict) -> None:
        if task_id == "missing":
            raise OpError("not_found", "task 'missing' not found")
        unknown = set(params) - {"mode"}
        if unknown:
            raise ValueError(f"unknown params {sorted(unknown)}")
        self.task_id, self.turns, self.log = task_id, 0, []

    def reset(self) -> list[dict]:
        return [{"role": "system", "content": "tools"}, {"role": "user", "content": f"task {self.task_id}"}]

    def step(self, content: str) -> SimpleNamespace:
        if content == "raise":
            raise RuntimeError("secret internal detail\n  File 'x.py', line 1")
        if content == "bad":
            raise ValueError("episode already finished")
        if content == "hang":
            time.sleep(60)
        self.log.append(content)
        return SimpleNamespace(observation=f"seen {len(self.log)}: {content}", terminated=content == "done",
                               info={"n": len(self.log)})

    def evaluate(self, sparse: bool) -> float | dict:
        score = 1.0 if self.log and self.log[-1] == "done" else 0.0
        return score if sparse else {"valid": score == 1.0, "accuracy": score, "log": list(self.log)}

    def info(self) -> dict:
        return {"tools_count": 1}


def scripted_host() -> EpisodeHost:
    return EpisodeHost(ScriptedEpisode)


@pytest.fixture(scope="module", params=[0, 2], ids=["inline", "workers"])
def http(request: pytest.FixtureRequest):
    """One service per backend for the whole module (starting workers takes a second); tests use unique ids."""
    app = create_app(ServiceConfig(workers=request.param, host_factory=SELF))
    with TestClient(app, raise_server_exceptions=False) as tc:
        yield tc


def _assert_one_line_error(resp, status: int, code: str) -> str:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert body["success"] is False and body["error"]["code"] == code
    assert "\n" not in body["detail"] and "Traceback" not in resp.text and 'File "' not in resp.text
    return body["detail"]


def test_compat_round_trip_and_envelopes(http: TestClient) -> None:
    assert http.get("/healthz").text == "OK"
    r = http.post("/create", json={"env_type": "bfcl", "task_id": "t1", "instance_id": "a1", "messages": {},
                                   "params": {}}).json()
    assert r["success"] is True and [m["role"] for m in r["data"]["state"]] == ["system", "user"]
    assert r["data"]["info"]["instance_id"] == "a1" and r["data"]["info"]["tools_count"] == 1
    s = http.post("/step", json={"instance_id": "a1", "messages": {"role": "assistant", "content": "hi"}}).json()
    assert s["data"]["state"] == [{"role": "user", "content": "seen 1: hi", "tool_calls": []}]
    assert s["data"]["is_terminated"] is False and s["data"]["reward"] == 0.0 and s["data"]["info"] == {"n": 1}
    s = http.post("/step", json={"instance_id": "a1", "messages": {"role": "assistant", "content": "done"}}).json()
    assert s["data"]["is_terminated"] is True and s["data"]["reward"] == 1.0
    assert http.post("/evaluate", json={"instance_id": "a1", "params": {"sparse": True}}).json()["data"] == 1.0
    full = http.post("/evaluate", json={"instance_id": "a1", "params": {}}).json()["data"]
    assert full["log"] == ["hi", "done"]
    assert http.post("/get_info", json={"instance_id": "a1"}).json() == {"success": True, "data": {"tools_count": 1}}
    assert http.post("/release", json={"instance_id": "a1"}).json() == {"success": True, "data": None}
    assert http.post("/release", json={"instance_id": "a1"}).json() == {"success": False, "data": None}


def test_create_generates_an_instance_id(http: TestClient) -> None:
    a = http.post("/create", json={"task_id": "t"}).json()["data"]["info"]["instance_id"]
    b = http.post("/create", json={"task_id": "t"}).json()["data"]["info"]["instance_id"]
    assert a and b and a != b
    assert http.post("/step", json={"instance_id": a, "messages": {"content": "x"}}).status_code == 200


def test_v1_routes_are_typed(http: TestClient) -> None:
    before = http.get("/metrics").json()
    c = http.post("/v1/create", json={"task_id": "t", "instance_id": "v"}).json()
    assert c["protocol_version"] == "1" and c["instance_id"] == "v" and len(c["messages"]) == 2
    s = http.post("/v1/step", json={"instance_id": "v", "content": "done"}).json()
    assert s["observation"] == {"role": "user", "content": "seen 1: done", "tool_calls": []}
    assert s["terminated"] is True and s["reward"] == 1.0
    e = http.post("/v1/evaluate", json={"instance_id": "v"}).json()
    assert e["score"] == 1.0 and e["result"]["valid"] is True
    assert http.post("/v1/evaluate", json={"instance_id": "v", "sparse": True}).json()["result"] is None
    assert http.post("/v1/release", json={"instance_id": "v"}).json()["released"] is True
    h = http.get("/v1/healthz").json()
    assert h["status"] == "ok" and h["workers"] == h["workers_alive"] >= 1
    m = http.get("/metrics").json()
    for key in ("created_total", "released_total", "steps_total"):
        assert m[key] == before[key] + 1, key
    assert m["instances_live"] == before["instances_live"]
    assert m["latency"]["/v1/step"]["count"] == before["latency"].get("/v1/step", {"count": 0})["count"] + 1
    assert "/v1/step" in http.get("/openapi.json").json()["paths"]


@pytest.mark.parametrize("route,body,status,code", [
    ("/create", {"env_type": "other", "task_id": "t"}, 400, "bad_request"),
    ("/create", {"task_id": None}, 400, "bad_request"),
    ("/create", {"task_id": "t", "params": {"nope": 1}}, 400, "bad_request"),
    ("/create", {"task_id": "t", "params": "x"}, 400, "bad_request"),
    ("/create", {"task_id": "missing"}, 404, "not_found"),
    ("/create", {"task_id": "t", "instance_id": "has space"}, 400, "bad_request"),
    ("/step", {"instance_id": "ghost", "messages": {"content": "x"}}, 404, "not_found"),
    ("/step", {"messages": {"content": "x"}}, 400, "bad_request"),
    ("/evaluate", {"instance_id": "ghost"}, 404, "not_found"),
    ("/get_info", {"instance_id": "ghost"}, 404, "not_found"),
    ("/v1/step", {"instance_id": "ghost", "content": "x"}, 404, "not_found"),
    ("/v1/step", {"instance_id": "ghost", "content": 3}, 400, "bad_request"),
    ("/v1/create", {"task_id": "t", "extra": 1}, 400, "bad_request"),
    ("/v1/profile", {"split": "nope"}, 400, "bad_request"),
    ("/nowhere", {}, 404, "not_found"),
])
def test_bad_input_gets_one_line_4xx(http: TestClient, route: str, body: dict, status: int, code: str) -> None:
    _assert_one_line_error(http.post(route, json=body), status, code)


def test_malformed_json_and_bad_step_bodies(http: TestClient) -> None:
    _assert_one_line_error(http.post("/create", content=b"{not json", headers={"content-type": "application/json"}),
                           400, "bad_request")
    http.post("/v1/create", json={"task_id": "t", "instance_id": "s"})
    _assert_one_line_error(http.post("/step", json={"instance_id": "s", "messages": {"role": "assistant"}}),
                           400, "bad_request")
    _assert_one_line_error(http.post("/v1/create", json={"task_id": "t", "instance_id": "s"}), 409, "conflict")
    _assert_one_line_error(http.post("/v1/step", json={"instance_id": "s", "content": "bad"}), 400, "bad_request")


def test_episode_exception_is_a_500_without_traceback(http: TestClient) -> None:
    http.post("/v1/create", json={"task_id": "t", "instance_id": "boom"})
    detail = _assert_one_line_error(http.post("/v1/step", json={"instance_id": "boom", "content": "raise"}),
                                    500, "internal")
    assert "RuntimeError" in detail
    # The instance survives its own failed step.
    assert http.post("/v1/step", json={"instance_id": "boom", "content": "ok"}).status_code == 200


def test_unexpected_errors_and_huge_bodies_get_one_line_answers() -> None:
    app = create_app(ServiceConfig(workers=0, host_factory=scripted_host, max_content_chars=1000))

    async def broken(req: object) -> None:
        raise KeyError("a bug in the service itself")

    with TestClient(app, raise_server_exceptions=False) as http:
        app.state.service.v1_step = broken
        detail = _assert_one_line_error(http.post("/v1/step", json={"instance_id": "x", "content": "y"}),
                                        500, "internal")
        assert "KeyError" in detail
        _assert_one_line_error(http.post("/v1/create", json={"task_id": "t", "params": {"mode": "x" * 10**5}}),
                               413, "too_large")
        http.post("/v1/create", json={"task_id": "t", "instance_id": "long"})
        _assert_one_line_error(http.post("/step", json={"instance_id": "long", "messages": {"content": "x" * 1001}}),
                               413, "too_large")  # the compat route: the typed one is broken on purpose


def test_instance_cap_answers_503_and_frees_on_release() -> None:
    with TestClient(create_app(ServiceConfig(workers=0, host_factory=scripted_host, max_instances=3))) as http:
        _fill_to_cap(http)


def _fill_to_cap(http: TestClient) -> None:
    for i in range(3):
        assert http.post("/v1/create", json={"task_id": "t", "instance_id": f"c{i}"}).status_code == 200
    detail = _assert_one_line_error(http.post("/v1/create", json={"task_id": "t"}), 503, "unavailable")
    assert "cap" in detail
    assert http.get("/metrics").json()["rejected_over_cap_total"] == 1
    http.post("/v1/release", json={"instance_id": "c0"})
    assert http.post("/v1/create", json={"task_id": "t"}).status_code == 200


def test_idle_instances_are_reaped_after_ttl() -> None:
    app = create_app(ServiceConfig(workers=0, host_factory=scripted_host, ttl_s=0.3, reap_interval_s=0.05))
    with TestClient(app) as http:
        http.post("/v1/create", json={"task_id": "t", "instance_id": "idle"})
        http.post("/v1/create", json={"task_id": "t", "instance_id": "busy"})
        for _ in range(8):  # keep "busy" in use for longer than the TTL
            time.sleep(0.1)
            assert http.post("/v1/step", json={"instance_id": "busy", "content": "x"}).status_code == 200
        detail = _assert_one_line_error(http.post("/v1/step", json={"instance_id": "idle", "content": "x"}),
                                        404, "not_found")
        assert "reaped" in detail
        m = http.get("/metrics").json()
        assert m["reaped_total"] == 1 and m["instances_live"] == 1


def test_worker_death_is_reported_and_the_slot_restarts() -> None:
    app = create_app(ServiceConfig(workers=2, host_factory=SELF))
    with TestClient(app) as http:
        for i in range(4):
            http.post("/v1/create", json={"task_id": "t", "instance_id": f"w{i}"})
        service = app.state.service
        victim_slot = service._instances["w0"].slot
        victim_pid = service.backend._workers[victim_slot].process.pid
        os.kill(victim_pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while service.backend.generation(victim_slot) == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        detail = _assert_one_line_error(http.post("/v1/step", json={"instance_id": "w0", "content": "x"}),
                                        503, "unavailable")
        assert "lost" in detail and str(victim_pid) in detail
        survivors = [i for i in range(4) if service._instances.get(f"w{i}") is not None]
        assert len(survivors) == 2  # least-loaded placement put two episodes on each worker
        for i in survivors:
            assert http.post("/v1/step", json={"instance_id": f"w{i}", "content": "x"}).status_code == 200
        while service.workers_alive() < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert service.workers_alive() == 2 and http.get("/metrics").json()["lost_total"] == 2
        assert http.post("/v1/create", json={"task_id": "t"}).status_code == 200


def test_a_hung_worker_is_killed_after_the_request_timeout() -> None:
    app = create_app(ServiceConfig(workers=1, host_factory=SELF, request_timeout_s=1.0))
    with TestClient(app) as http:
        http.post("/v1/create", json={"task_id": "t", "instance_id": "h"})
        t0 = time.monotonic()
        detail = _assert_one_line_error(http.post("/v1/step", json={"instance_id": "h", "content": "hang"}),
                                        503, "unavailable")
        assert time.monotonic() - t0 < 10 and "timed out" in detail
        deadline = time.monotonic() + 20
        while app.state.service.workers_alive() < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert http.post("/v1/create", json={"task_id": "t"}).status_code == 200


def test_in_process_client_maps_errors() -> None:
    with EnvClient.in_process(host_factory=scripted_host, max_instances=1) as client:
        assert client.healthz()
        ep = client.create("t", {"mode": "x"})
        with pytest.raises(EnvUnavailableError) as cap:
            client.create("t")
        assert cap.value.status == 503
        with pytest.raises(EnvServiceError) as unknown:
            client.step("ghost", "x")
        assert unknown.value.status == 404
        with pytest.raises(EnvServiceError):
            client.create("")
        assert client.step(ep.instance_id, "done").reward == 1.0
        assert client.evaluate(ep.instance_id, sparse=True) == 1.0
        assert client.release(ep.instance_id) and not client.release(ep.instance_id)


def _one_pass_cases() -> list[tuple[str, bytes, dict[str, str]]]:
    """(route, raw body, headers): valid bodies and every kind of bad one, for the two-path comparison."""
    json_type = {"content-type": "application/json"}
    deep = b'{"instance_id": "d1", "content": "x", "extra": ' + b"[" * 70 + b"]" * 70 + b"}"
    step_bodies = [
        b'{"instance_id": "d1", "content": "hi"}', b'{"content": "\\ud83d\\ude00 \\u00e9 \\n", "instance_id": "d1"}',
        '{"instance_id": "d1", "content": "é ☃"}'.encode(), b'{"instance_id": "d1", "content": "\\ud800"}',
        b'{"instance_id": "d1", "instance_id": "d2", "content": "dup"}',
        b'{"instance_id": "d1", "content": "x", "n": 1}',
        b'{"instance_id": "d1"}', b'{"instance_id": "d1", "content": 1}', b'{"instance_id": "", "content": "x"}',
        b'{"instance_id": "' + b"i" * 201 + b'", "content": "x"}', b'{"instance_id": "ghost", "content": "x"}',
        b'{"instance_id": "d1", "content": "' + b"x" * 1001 + b'"}', b'{"instance_id": "d1", "content": "raise"}',
        b"{", b"", b"[]", b"null", b'{"instance_id": "d1", "content": "x"} x', b'{"instance_id": "d1", "content": NaN}',
        '\ufeff{"instance_id": "d1", "content": "bom"}'.encode(),
        '{"instance_id": "d1", "content": "u16"}'.encode("utf-16"),
        b'{"instance_id": "d1", "content": "\xff"}', deep,
    ]
    cases = [("/v1/step", body, json_type) for body in step_bodies]
    for headers in ({"content-type": "text/plain"}, {"content-type": "application/json; charset=utf-8"}, {}):
        cases.append(("/v1/step", b'{"instance_id": "d1", "content": "typed"}', headers))
    for sparse in (b"true", b"false", b"1", b"0", b"1.0", b"2", b'"true"', b'"yes"', b'"no"', b"null", b"[]"):
        cases.append(("/v1/evaluate", b'{"instance_id": "d1", "sparse": ' + sparse + b"}", json_type))
    tail = [("/v1/evaluate", b'{"instance_id": "d1"}'), ("/v1/info", b'{"instance_id": "d1"}'),
            ("/v1/info", b'{"instance_id": "d1", "x": 1}'), ("/v1/release", b'{"instance_id": 7}'),
            ("/v1/release", b'{"instance_id": "d2"}'), ("/v1/release", b'{"instance_id": "d2"}'),
            ("/v1/step", b'{"instance_id": "d2", "content": "x"}')]
    cases += [(route, body, json_type) for route, body in tail]
    return cases


def test_one_pass_bodies_answer_exactly_as_fastapi_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """The per-step routes validate a JSON body in one pass (env_service.app._ONE_PASS_BODIES); with and
    without that path, every answer (status, headers that matter, body bytes) is the same."""
    import env_service.app as app_module

    config = dict(workers=0, host_factory=scripted_host, max_content_chars=1000)
    one_pass = create_app(ServiceConfig(**config))
    assert {r.path for r in one_pass.routes if isinstance(r, app_module._NestingLimitedRoute) and r._one_pass_body()} \
        == {"/v1/step", "/v1/evaluate", "/v1/release", "/v1/info"}
    monkeypatch.setattr(app_module, "_ONE_PASS_BODIES", ())
    plain = create_app(ServiceConfig(**config))
    answers: list[list[tuple[int, str | None, bytes]]] = []
    for app in (one_pass, plain):
        with TestClient(app, raise_server_exceptions=False) as http:
            for instance_id in ("d1", "d2"):
                assert http.post("/v1/create", json={"task_id": "t", "instance_id": instance_id}).status_code == 200
            answers.append([(r.status_code, r.headers.get("content-type"), r.content)
                            for r in (http.post(route, content=body, headers=headers)
                                      for route, body, headers in _one_pass_cases())])
            assert http.get("/openapi.json").json()["paths"]
    for case, got, want in zip(_one_pass_cases(), *answers):
        assert got == want, case
    assert sorted({status for status, _, _ in answers[0]}) == [200, 400, 404, 413, 500]


def test_episode_routes_are_matched_first_and_the_openapi_document_keeps_its_order() -> None:
    app = create_app(ServiceConfig(workers=0, host_factory=scripted_host))
    assert [r.path for r in app.routes[:4]] == ["/v1/step", "/v1/create", "/v1/evaluate", "/v1/release"]
    paths = list(TestClient(app).get("/openapi.json").json()["paths"])
    assert paths[:3] == ["/healthz", "/get_env_profile", "/create"] and paths.index("/v1/step") > paths.index("/step")
