"""EnvClient over HTTP against scripted transports: error mapping, retry policy, sticky replicas."""

from __future__ import annotations

import asyncio
import json
import socket
from collections import Counter

import httpx
import pytest

from env_service.client import EnvClient, EnvServiceError, EnvUnavailableError


def _error(status: int, code: str, message: str) -> httpx.Response:
    return httpx.Response(status, json={"success": False, "detail": message,
                                        "error": {"code": code, "message": message}, "protocol_version": "1"})


class Scripted:
    """An httpx transport handler answering from a per-route script and logging every request."""

    def __init__(self, **by_route: list[httpx.Response | Exception]) -> None:
        self.by_route = by_route
        self.seen: list[tuple[str, str]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.seen.append((request.url.host, request.url.path))
        script = self.by_route[request.url.path.rsplit("/", 1)[-1]]
        answer = script.pop(0) if len(script) > 1 else script[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


def _client(handler: Scripted, urls: list[str] | str = "http://env-a:1", **kw) -> EnvClient:
    client = EnvClient(urls, backoff_s=0.0, **kw)
    mock = httpx.Client(transport=httpx.MockTransport(handler))
    client._http._sync_client = lambda shard: mock  # every shard answers from the script
    return client


def _step_ok() -> httpx.Response:
    return httpx.Response(200, json={"protocol_version": "1", "terminated": False, "reward": 0.0, "info": {},
                                     "observation": {"role": "user", "content": "obs", "tool_calls": []}})


def test_4xx_is_a_service_error_and_is_not_retried() -> None:
    handler = Scripted(step=[_error(404, "not_found", "instance 'x' not found")])
    with _client(handler, retries=3) as client:
        with pytest.raises(EnvServiceError) as err:
            client.step("x", "hi")
    assert err.value.status == 404 and err.value.code == "not_found" and "instance 'x'" in err.value.message
    assert len(handler.seen) == 1


def test_step_and_create_are_never_resent_after_a_503() -> None:
    handler = Scripted(step=[_error(503, "unavailable", "worker lost")],
                       create=[_error(503, "unavailable", "instance cap reached")])
    with _client(handler, retries=3) as client:
        with pytest.raises(EnvUnavailableError) as err:
            client.step("x", "hi")
        assert err.value.status == 503 and "worker lost" in err.value.message
        with pytest.raises(EnvUnavailableError):
            client.create("multi_turn_base_0")
    assert [path for _, path in handler.seen] == ["/v1/step", "/v1/create"]


def test_step_is_resent_only_when_the_connection_was_refused() -> None:
    handler = Scripted(step=[httpx.ConnectError("refused"), _step_ok()])
    with _client(handler, retries=2) as client:
        assert client.step("x", "hi").observation == "obs"
    assert len(handler.seen) == 2
    handler = Scripted(step=[httpx.ReadTimeout("slow")])
    with _client(handler, retries=2) as client:
        with pytest.raises(EnvUnavailableError) as err:
            client.step("x", "hi")
    assert err.value.code == "timeout" and len(handler.seen) == 1


def test_idempotent_calls_are_retried_then_give_up() -> None:
    handler = Scripted(evaluate=[_error(503, "unavailable", "busy"),
                                 httpx.Response(200, json={"protocol_version": "1", "score": 1.0, "result": None})])
    with _client(handler, retries=2) as client:
        assert client.evaluate("x", sparse=True) == 1.0
    assert len(handler.seen) == 2
    handler = Scripted(release=[_error(500, "internal", "boom")])
    with _client(handler, retries=2) as client:
        with pytest.raises(EnvUnavailableError) as err:
            client.release("x")
    assert err.value.status == 500 and len(handler.seen) == 3


def test_non_json_error_bodies_still_give_a_one_line_error() -> None:
    handler = Scripted(step=[httpx.Response(502, text="<html>\nBad gateway\n</html>")])
    with _client(handler) as client:
        with pytest.raises(EnvUnavailableError) as err:
            client.step("x", "hi")
    assert err.value.status == 502 and "\n" not in err.value.message


def test_an_episode_sticks_to_one_replica_and_replicas_share_the_load() -> None:
    handler = Scripted(step=[_step_ok()])
    urls = ["http://env-a:1", "http://env-b:1", "http://env-c:1"]
    with _client(handler, urls) as client:
        for k in range(60):
            for _ in range(3):
                client.step(f"inst-{k}", "hi")
    hosts_by_episode = [{host for host, _ in handler.seen[3 * k: 3 * k + 3]} for k in range(60)]
    assert all(len(hosts) == 1 for hosts in hosts_by_episode)
    load = Counter(host for host, _ in handler.seen)
    assert set(load) == {"env-a", "env-b", "env-c"} and min(load.values()) >= 30


def test_create_picks_the_instance_id_before_choosing_a_replica() -> None:
    bodies: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        bodies.append(body)
        return httpx.Response(200, json={"protocol_version": "1", "instance_id": body["instance_id"],
                                         "messages": [{"role": "system", "content": "s"},
                                                      {"role": "user", "content": "u"}], "info": {}})

    client = _client(handler, ["http://env-a:1", "http://env-b:1"])
    with client:
        created = client.create("multi_turn_base_0", {"enforce_available_tools": False})
    assert bodies[0]["instance_id"] == created.instance_id and created.instance_id.startswith("inst_")
    assert bodies[0]["params"] == {"enforce_available_tools": False}
    assert created.messages == [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]


def test_no_service_listening_is_unavailable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound but not listening: connections are refused
        with EnvClient(f"http://127.0.0.1:{port}", retries=1, backoff_s=0.0) as client:
            assert client.healthz() is False
            with pytest.raises(EnvUnavailableError) as err:
                client.create("multi_turn_base_0")
            assert err.value.code == "connect"

            async def via_async() -> None:
                with pytest.raises(EnvUnavailableError):
                    await client.astep("x", "hi")
                await client.aclose()

            asyncio.run(via_async())


def test_client_side_validation_errors_are_service_errors() -> None:
    with _client(Scripted()) as client:
        with pytest.raises(EnvServiceError) as err:
            client.get_env_profile("everything")
        assert err.value.status == 400 and "split" in err.value.message
    with pytest.raises(ValueError, match="URL"):
        EnvClient(None)
