"""The BFCL environment over real HTTP: ``python -m env_service`` in a subprocess on a free port."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from env_service.bfcl.episode import BfclEpisode
from env_service.bfcl.tasks import CATEGORIES, default_store
from env_service.client import EnvClient, EnvServiceError

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def service_url() -> Iterator[str]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "env_service", "--host", "127.0.0.1", "--port", str(port),
                             "--workers", "2", "--log-level", "warning"], cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    probe = EnvClient(url)
    try:
        deadline = time.monotonic() + 90
        while not probe.healthz():
            assert proc.poll() is None, f"the service exited with code {proc.returncode}"
            assert time.monotonic() < deadline, "the service did not answer /healthz within 90 s"
            time.sleep(0.1)
        yield url
    finally:
        probe.close()
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _release_style(http: httpx.Client, route: str, **fields: object) -> httpx.Response:
    """A request as the release's client sends it: always all five keys."""
    body = {"env_type": "bfcl", "task_id": None, "instance_id": None, "messages": {}, "params": {}}
    body.update(fields)
    return http.post(route, json=body)


def _tool_call(name: str, **arguments: object) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def test_release_compatible_routes(service_url: str) -> None:
    with httpx.Client(base_url=service_url, timeout=30) as http:
        assert http.get("/healthz").text == "OK"
        created = _release_style(http, "/create", task_id="multi_turn_base_0", instance_id="compat-1").json()
        assert created["success"] is True
        state, info = created["data"]["state"], created["data"]["info"]
        assert [m["role"] for m in state] == ["system", "user"] and "<tools>" in state[0]["content"]
        assert info["instance_id"] == "compat-1" and info["task_id"] == "multi_turn_base_0"

        step = _release_style(http, "/step", instance_id="compat-1",
                              messages={"role": "assistant", "content": _tool_call("pwd")}).json()["data"]
        assert set(step) == {"state", "reward", "is_terminated", "info"}
        assert len(step["state"]) == 1
        obs = step["state"][0]
        assert obs["role"] == "user" and obs["tool_calls"] == [] and "<tool_response>" in obs["content"]
        assert step["is_terminated"] is False and step["reward"] == 0.0

        bad = _release_style(http, "/step", instance_id="compat-1",
                             messages={"role": "assistant", "content": "<tool_call>{oops</tool_call>"}).json()
        assert bad["data"]["state"][0]["content"].startswith("[ERROR] Invalid tool call format: ")

        sparse = _release_style(http, "/evaluate", instance_id="compat-1", params={"sparse": True}).json()["data"]
        assert sparse == 0.0
        full = _release_style(http, "/evaluate", instance_id="compat-1", params={"sparse": False}).json()["data"]
        assert full["valid"] is False and len(full["bfcl_progress_info"]["failure_tags"]) == 4
        assert _release_style(http, "/get_info", instance_id="compat-1").json()["data"]["task_id"] == "multi_turn_base_0"

        sizes = {s: len(_release_style(http, "/get_env_profile", params={"split": s}).json()["data"])
                 for s in ("train", "val", "test", "eval")}
        assert sizes == {"train": 400, "val": 100, "test": 300, "eval": 400}

        assert _release_style(http, "/release", instance_id="compat-1").json() == {"success": True, "data": None}
        assert _release_style(http, "/release", instance_id="compat-1").json() == {"success": False, "data": None}


@pytest.mark.parametrize("route,fields,status,needle", [
    ("/create", {"task_id": "multi_turn_base_9999"}, 404, "multi_turn_base_9999"),
    ("/create", {"task_id": "multi_turn_base_0", "params": {"enforce_tools": True}}, 400, "enforce_tools"),
    ("/create", {"task_id": "multi_turn_base_0", "params": {"tool_call_parser": "nope"}}, 400, "tool_call_parser"),
    ("/step", {"instance_id": "never-created", "messages": {"role": "assistant", "content": "hi"}}, 404,
     "never-created"),
    ("/evaluate", {"instance_id": "never-created"}, 404, "never-created"),
])
def test_bad_requests_get_a_one_line_reason(service_url: str, route: str, fields: dict, status: int,
                                            needle: str) -> None:
    with httpx.Client(base_url=service_url, timeout=30) as http:
        resp = _release_style(http, route, **fields)
    assert resp.status_code == status
    detail = resp.json()["detail"]
    assert needle in detail and "\n" not in detail and "Traceback" not in resp.text


def test_two_concurrent_episodes_of_one_task_are_isolated(service_url: str) -> None:
    with EnvClient(service_url) as client:
        # Four instances: least-loaded placement puts two on each worker, so both cases are covered.
        ids = [client.create("multi_turn_base_0", instance_id=f"iso-{k}").instance_id for k in range(4)]
        for k, iid in enumerate(ids):
            out = client.step(iid, _tool_call("mkdir", dir_name=f"made_by_{k}"))
            assert "Error" not in out.observation
        for k, iid in enumerate(ids):
            listing = client.step(iid, _tool_call("ls")).observation
            assert f"made_by_{k}" in listing
            assert all(f"made_by_{j}" not in listing for j in range(4) if j != k)
        for iid in ids:
            assert client.release(iid)


def _scripted_episode(client: EnvClient, task_id: str, instance_id: str) -> list:
    """A mixed episode: the oracle's first message, a parse error, a tool error, then the rest."""
    oracle = BfclEpisode.oracle(default_store().get(task_id))
    script = [oracle[0], "<tool_call>{not json}</tool_call>", _tool_call("cd", folder="no_such_dir"), *oracle[1:]]
    created = client.create(task_id, {"enforce_available_tools": False}, instance_id=instance_id)
    trace: list = [created.messages, created.info]
    trace += [client.step(instance_id, text) for text in script]
    trace += [client.evaluate(instance_id, sparse=True), client.evaluate(instance_id), client.get_info(instance_id),
              client.release(instance_id)]
    return trace


def test_in_process_and_http_clients_agree(service_url: str) -> None:
    with EnvClient(service_url) as http_client, EnvClient.in_process() as local_client:
        for task_id in ("multi_turn_miss_func_0", "multi_turn_long_context_3"):
            over_http = _scripted_episode(http_client, task_id, f"same-{task_id}")
            in_process = _scripted_episode(local_client, task_id, f"same-{task_id}")
            assert over_http == in_process
            assert over_http[-5].terminated and over_http[-5].observation == "[CONVERSATION_COMPLETED]"
            events = over_http[-3]["events"]
            assert events["parse_errors"] == 1 and events["tool_errors"] >= 1


def test_what_the_trainer_asks_without_an_episode_is_the_same_over_http(service_url: str) -> None:
    """The catalogue, the params check, a task's oracle and an offline judgement: the routes the
    trainer reaches the environment by (it imports nothing else of env_service)."""
    task_id = "multi_turn_base_0"
    with EnvClient(service_url) as http_client, EnvClient.in_process() as local_client:
        answers = []
        for client in (http_client, local_client):
            catalogue = client.catalogue()
            gt_turns, messages = client.oracle(task_id, "python_list")
            answers.append((catalogue, gt_turns, messages, client.check_params({"max_steps_per_turn": "many"}),
                            client.check_params({"observation_lite": {"enable": True}}),
                            client.judge(task_id, [[calls] for calls in gt_turns]),
                            client.judge(task_id, [[calls] for calls in gt_turns[:-1]] + [[]])))
        assert answers[0] == answers[1]
        catalogue, gt_turns, messages, bad, good, passed, missed = answers[0]
    assert len(catalogue.load_split("train")) == 400 and catalogue.categories[task_id] == "multi_turn_base"
    assert catalogue.tool_parameters["mv"] == ["source", "destination"]
    assert gt_turns == [list(t) for t in default_store().get(task_id).gt_turns] and len(messages) > len(gt_turns)
    assert bad is not None and "max_steps_per_turn" in bad and good is None
    assert passed["valid"] is True and missed["valid"] is False and missed["failure_tags"][-1] == "empty_turn_model_response"
    with pytest.raises(EnvServiceError, match="unknown bfcl task id"):
        EnvClient(service_url).oracle("multi_turn_base_9999")


async def _replay_all(client: EnvClient, enforce: bool, concurrency: int = 16) -> list[str]:
    store = default_store()
    queue = [store.get(tid) for tid in store.ids() if store.get(tid).category in CATEGORIES]
    failed: list[str] = []
    done = 0

    async def lane() -> None:
        nonlocal done
        while queue:
            task = queue.pop()
            ep = await client.acreate(task.id, {"enforce_available_tools": enforce})
            out = None
            for text in BfclEpisode.oracle(task):
                out = await client.astep(ep.instance_id, text)
            assert out is not None and out.terminated
            if out.reward != 1.0:
                failed.append(task.id)
            await client.arelease(ep.instance_id)
            done += 1

    await asyncio.gather(*(lane() for _ in range(concurrency)))
    assert done == 800
    return sorted(failed)


@pytest.mark.slow
def test_all_800_oracles_pass_over_http(service_url: str) -> None:
    async def both() -> tuple[list[str], list[str]]:
        client = EnvClient(service_url, max_connections=32)
        try:
            return await asyncio.gather(_replay_all(client, enforce=False), _replay_all(client, enforce=True))
        finally:
            await client.aclose()
            client.close()

    without_enforcement, with_enforcement = asyncio.run(both())
    assert without_enforcement == []
    # Its ground truth calls `tail` one turn before `tail` is revealed (the release's 399/400 ceiling).
    assert with_enforcement == ["multi_turn_miss_func_49"]
    with EnvClient(service_url) as client:
        metrics = client.metrics()
    assert metrics["instances_live"] == 0 and metrics["created_total"] >= 1600
