"""Every request gets a 2xx/4xx answer, and an answer never costs the connection it came on.

* Deeply nested bodies (``/create`` and ``/v1/create`` params, an interface block, a release-style
  ``messages``) are refused with a one-line 413 as they are parsed; before, a body nesting 600-900
  levels reached the worker pipe and answered ``500 ... RecursionError ... while pickling``.
* After a 500 the kept-alive connection still answers: before, the 500 came from Starlette's
  last-resort handler, which re-raises to uvicorn, and uvicorn then closed the connection.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import uvicorn

from env_service.app import create_app
from env_service.client import EnvClient, EnvServiceError
from env_service.schemas import MAX_NESTING
from env_service.service import EnvService, ServiceConfig
from live_service import free_port, running_service


def nested_object(depth: int) -> dict:
    """``{"a": {"a": ... 1}}`` with ``depth`` objects."""
    value: object = 1
    for _ in range(depth):
        value = {"a": value}
    return value  # type: ignore[return-value]


def nested_list(depth: int) -> list:
    return json.loads("[" * depth + "]" * depth)


def assert_too_deep(resp: httpx.Response) -> None:
    assert resp.status_code == 413, (resp.status_code, resp.text[:300])
    body = resp.json()
    assert body["error"]["code"] == "too_large" and "\n" not in body["detail"], body
    assert f"deeper than {MAX_NESTING} levels" in body["detail"], body["detail"]


@pytest.fixture(scope="module")
def notes_service() -> Iterator[str]:
    with running_service("--env", "notes", workers=1) as (url, _):
        yield url


def test_deep_nesting_is_refused_with_one_line_413(notes_service: str) -> None:
    with httpx.Client(base_url=notes_service, timeout=60) as http:
        task_id = http.post("/v1/profile", json={"split": "train"}).json()["task_ids"][0]
        for depth in (600, 750, 900):
            assert_too_deep(http.post("/create", json={"env_type": "notes", "task_id": task_id,
                                                       "params": {"x": nested_object(depth)}}))
            assert_too_deep(http.post("/v1/create", json={"task_id": task_id, "params": {"x": nested_list(depth)}}))
            assert_too_deep(http.post("/v1/create", json={"task_id": task_id, "params": {
                "observation_lite": {"enable": True, "categories": nested_list(depth)}}}))
            assert_too_deep(http.post("/step", json={"instance_id": "x", "messages": nested_list(depth)}))
        # Just past the limit is refused; a body at the limit reaches validation (a 400 for this one).
        assert_too_deep(http.post("/v1/create", json={"task_id": task_id, "params": {"x": nested_list(MAX_NESTING - 1)}}))
        at_limit = http.post("/v1/create", json={"task_id": task_id, "params": {"x": nested_list(MAX_NESTING - 2)}})
        assert at_limit.status_code == 400, at_limit.text[:300]
        created = http.post("/v1/create", json={"task_id": task_id})
        assert created.status_code == 200, created.text[:300]
        errors = http.get("/metrics").json()["errors_total"]
    assert errors.get("internal", 0) == 0 and errors["too_large"] >= 13, errors


def test_in_process_client_refuses_deep_params_the_same_way() -> None:
    with EnvClient.in_process(env="notes") as client:
        task_id = client.get_env_profile("train")[0]
        with pytest.raises(EnvServiceError) as err:
            client.create(task_id, params={"x": nested_object(700)})
    assert err.value.status == 413 and "deeper than" in err.value.message


@pytest.fixture()
def failing_service() -> Iterator[tuple[str, EnvService]]:
    """A real uvicorn server (in a thread) over an inline ``notes`` service, for injecting failures."""
    service = EnvService(ServiceConfig(workers=0, env="notes"))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(service=service), host="127.0.0.1", port=port,
                                           log_level="critical", timeout_keep_alive=30))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the service did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}", service
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def _client_port(resp: httpx.Response) -> int | None:
    """The local port of the connection that carried ``resp`` (the same port: the same connection);
    ``None`` when that connection is closed already."""
    try:
        return resp.extensions["network_stream"].get_extra_info("client_addr")[1]
    except OSError:
        return None


def test_a_500_keeps_the_connection_alive(failing_service: tuple[str, EnvService],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    url, service = failing_service

    async def broken(split: str = "train") -> list[str]:
        raise RuntimeError("injected failure")

    monkeypatch.setattr(service, "env_profile", broken)
    with httpx.Client(base_url=url, timeout=10, limits=httpx.Limits(max_connections=1)) as http:
        failed = http.post("/v1/profile", json={"split": "train"})
        port = _client_port(failed)
        assert failed.status_code == 500, failed.text[:300]
        assert port is not None, "the connection was closed with the 500"
        body = failed.json()
        assert body["error"]["code"] == "internal" and "injected failure" in body["detail"], body
        assert "Traceback" not in failed.text and "\n" not in body["detail"]
        for _ in range(3):
            after = http.get("/v1/healthz")
            assert after.status_code == 200, after.text[:300]
            assert _client_port(after) == port, "the 500 cost the connection"
        again = http.post("/v1/profile", json={"split": "train"})
        assert again.status_code == 500 and _client_port(again) == port
    assert service.metrics().errors_total["internal"] == 2


def test_a_500_on_a_raw_socket_is_followed_by_the_next_answer(failing_service: tuple[str, EnvService],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The same, byte by byte: two requests written on one socket both get their answer."""
    url, service = failing_service

    async def broken(split: str = "train") -> list[str]:
        raise RuntimeError("injected failure")

    monkeypatch.setattr(service, "env_profile", broken)
    port = int(url.rsplit(":", 1)[1])
    body = b'{"split": "train"}'
    request = (b"POST /v1/profile HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    health = b"GET /v1/healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(request)
        first = _read_response(conn)
        conn.sendall(health)
        second = _read_response(conn)
    assert first.startswith(b"HTTP/1.1 500"), first[:200]
    assert second.startswith(b"HTTP/1.1 200"), second[:200]


def _read_response(conn: socket.socket) -> bytes:
    """One HTTP/1.1 response with a ``content-length`` (what this service sends), or what came before EOF."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(rest) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        rest += chunk
    return head + b"\r\n\r\n" + rest
