"""``seal eval``: one episode (``evaluate_episode``) and ``run_eval`` against a scripted environment double.

The double follows the episode protocol of the environment service: a reply with a
``<tool_call>`` block gets a ``<tool_response>`` observation; a plain reply advances to the next
user turn; after the last turn the episode terminates. A task passes when every turn saw the
call ``ok()``.
"""

from __future__ import annotations

import itertools
import json
import threading
from dataclasses import replace

import pytest

from env_service.client import CreateResult, StepResult
from seal.eval.logs import read_log_file
from seal.eval.policies import Completion, ContextOverflowError, SamplingSettings
from seal.eval.evaluate import EvalSettings, evaluate_episode, run_eval
from seal.rollout.settings import RolloutSettings


class FakeEnv:
    """Scripted environment with the EnvClient surface (create/step/evaluate/release)."""

    counter = itertools.count()

    def __init__(self, turns: int = 2, fail_create: set[str] | None = None) -> None:
        self.turns = turns
        self.fail_create = fail_create or set()
        self.live: dict[str, dict] = {}
        self.released: list[str] = []
        self.params_seen: list[dict] = []
        self.lock = threading.Lock()

    def create(self, task_id, params):
        if task_id in self.fail_create:
            raise RuntimeError(f"cannot create {task_id}")
        with self.lock:
            iid = f"i{next(self.counter)}"
            self.live[iid] = {"task": task_id, "turn": 0, "calls": [[] for _ in range(self.turns)]}
            self.params_seen.append(dict(params))
        return CreateResult(iid, [{"role": "system", "content": f"tools for {task_id}"},
                                  {"role": "user", "content": "turn 0"}],
                            {"instance_id": iid, "category": task_id.rsplit("_", 1)[0]})

    def step(self, iid, content):
        ep = self.live[iid]
        if "<tool_call>" in content:
            name = content.split('"name": "')[1].split('"')[0]
            ep["calls"][ep["turn"]].append(f"{name}()")
            return StepResult("<tool_response>done</tool_response>", False, 0.0, {})
        ep["turn"] += 1
        if ep["turn"] >= self.turns:
            return StepResult("[CONVERSATION_COMPLETED]", True, 0.0, {})
        return StepResult(f"turn {ep['turn']}", False, 0.0, {})

    def evaluate(self, iid, sparse=False):
        ep = self.live[iid]
        valid = all(c == ["ok()"] for c in ep["calls"]) and ep["turn"] >= self.turns
        return {"valid": valid, "accuracy": float(valid),
                "error_type": None if valid else "multi_turn:instance_state_mismatch",
                "failure_tags": ["pass" if c == ["ok()"] else "state_mismatch" for c in ep["calls"]],
                "model_turns": [[c] if c else [] for c in ep["calls"]]}

    def release(self, iid):
        with self.lock:
            self.live.pop(iid)
            self.released.append(iid)


class ScriptedPolicy:
    """Calls ``ok()`` (or ``bad()`` for tasks in ``wrong``) once per turn, then replies in text."""

    def __init__(self, wrong: set[str] = frozenset(), overflow_after: int | None = None) -> None:
        self.wrong = wrong
        self.overflow_after = overflow_after
        self.calls = 0
        self.seen_sampling: list[SamplingSettings] = []

    def complete(self, messages, sampling):
        self.calls += 1
        self.seen_sampling.append(sampling)
        if self.overflow_after is not None and len(messages) > self.overflow_after:
            raise ContextOverflowError("too long")
        if messages[-1]["content"].startswith("<tool_response>"):
            return "Done."
        task = messages[0]["content"].split()[-1]
        name = "bad" if task in self.wrong else "ok"
        return f'<tool_call>{{"name": "{name}", "arguments": {{}}}}</tool_call>'


class LoopingPolicy:
    def complete(self, messages, sampling):
        return '<tool_call>{"name": "ok", "arguments": {}}</tool_call>'


def test_episode_protocol_and_record():
    env, policy = FakeEnv(turns=2), ScriptedPolicy()
    rec = evaluate_episode(env, policy, "multi_turn_base_4", params={"rollout_mode": "validate"},
                      sampling=SamplingSettings(), step=5, split="val")
    assert rec.valid and rec.score == 1.0 and rec.error is None
    assert rec.num_llm_calls == 4 and rec.terminated_reason == "terminated"
    assert [m["role"] for m in rec.messages] == ["system", "user"] + ["assistant", "user"] * 4
    assert rec.tags == ["pass", "pass"] and rec.model_turns == [[["ok()"]], [["ok()"]]]
    assert rec.data_source == "multi_turn_base" and rec.step == 5 and rec.split == "val"
    assert rec.generation["temperature"] == 0.0 and rec.generation["max_llm_calls"] == 20
    assert env.live == {} and len(env.released) == 1


def test_llm_call_cap_and_release_on_errors():
    env = FakeEnv(turns=2)
    rec = evaluate_episode(env, LoopingPolicy(), "multi_turn_base_9", params={}, sampling=SamplingSettings(),
                           budget=RolloutSettings(max_llm_calls=3))
    assert rec.num_llm_calls == 3 and rec.terminated_reason == "max_llm_calls" and not rec.valid
    assert env.live == {}

    class Boom(ScriptedPolicy):
        def complete(self, messages, sampling):
            raise RuntimeError("server exploded")

    rec = evaluate_episode(env, Boom(), "multi_turn_base_9", params={}, sampling=SamplingSettings())
    assert rec.error == "RuntimeError: server exploded" and rec.score == 0.0
    assert env.live == {}  # released despite the error

    rec = evaluate_episode(env, ScriptedPolicy(overflow_after=3), "multi_turn_base_9", params={},
                      sampling=SamplingSettings())
    assert rec.terminated_reason == "context_overflow" and rec.num_llm_calls == 1 and rec.error is None


class UsagePolicy(ScriptedPolicy):
    """An endpoint-like policy: no tokenizer, only the server's usage (100 prompt tokens a message)."""

    def complete_with_usage(self, messages, sampling):
        text = self.complete(messages, sampling)
        return Completion(text, prompt_tokens=100 * len(messages), completion_tokens=5, finish_reason="stop")


class CountingPolicy(ScriptedPolicy):
    """A local-checkpoint-like policy: counts the context itself (100 tokens a message)."""

    def count_tokens(self, messages):
        return 100 * len(messages)


def test_the_trainers_budget_ends_an_endpoint_episode_on_its_reported_usage():
    # Context cap 700 - 200 = 500 tokens: the call that sees 6 messages (600 tokens) is discarded,
    # as the trainers' runner would not have made it.
    budget = RolloutSettings(max_model_len=700, response_length=200)
    env, policy = FakeEnv(turns=3), UsagePolicy()
    rec = evaluate_episode(env, policy, "multi_turn_base_4", params={}, sampling=SamplingSettings(), budget=budget)
    assert rec.terminated_reason == "context_overflow" and not rec.valid and rec.error is None
    assert policy.calls == 3 and rec.num_llm_calls == 2 and len(rec.messages) == 6
    assert rec.generation["episode_budget"] == "context" and rec.generation["max_model_len"] == 700


def test_a_counting_policy_is_stopped_before_the_call_and_its_calls_get_the_room_left():
    budget = RolloutSettings(max_model_len=700, response_length=200)
    env, policy = FakeEnv(turns=3), CountingPolicy()
    rec = evaluate_episode(env, policy, "multi_turn_base_4", params={}, sampling=SamplingSettings(max_tokens=512),
                      budget=budget)
    assert rec.terminated_reason == "context_overflow" and policy.calls == 2 and rec.num_llm_calls == 2
    assert [s.max_tokens for s in policy.seen_sampling] == [min(512, 700 - 200), min(512, 700 - 400)]
    # The response budget counts the continuation after the prompt (2 messages) instead: 200
    # tokens of continuation after one call and its observation spend response_length=200.
    env, policy = FakeEnv(turns=3), CountingPolicy()
    rec = evaluate_episode(env, policy, "multi_turn_base_4", params={}, sampling=SamplingSettings(),
                      budget=replace(budget, episode_budget="response", max_model_len=10_000))
    assert rec.terminated_reason == "context_overflow" and rec.num_llm_calls == 1


def test_observations_take_the_role_the_environment_names():
    class IpythonEnv(FakeEnv):
        def create(self, task_id, params):
            created = super().create(task_id, params)
            return replace(created, info={**created.info, "observation_role": "ipython"})

    rec = evaluate_episode(IpythonEnv(turns=1), ScriptedPolicy(), "multi_turn_base_4", params={},
                           sampling=SamplingSettings())
    assert rec.valid and [m["role"] for m in rec.messages] == ["system", "user", "assistant", "ipython", "assistant", "ipython"]


def _ids(n: int) -> list[str]:
    cats = ["multi_turn_base", "multi_turn_miss_func"]
    return [f"{cats[i % 2]}_{i}" for i in range(n)]


def test_run_eval_writes_logs_summary_and_resumes(tmp_path):
    env = FakeEnv(turns=2, fail_create={"multi_turn_base_2"})
    ids = _ids(6)
    settings = EvalSettings(task_ids=ids, concurrency=3, progress=False, params={"rollout_mode": "sample"})
    policy = ScriptedPolicy(wrong={"multi_turn_miss_func_1"})
    summary = run_eval(settings, policy, lambda: env, tmp_path)
    log = tmp_path / "validation_log" / "0.jsonl"
    recs = read_log_file(log)
    assert sorted(r["task_id"] for r in recs) == sorted(ids)
    assert all(p["rollout_mode"] == "validate" for p in env.params_seen)  # validation interface forced
    rep = summary.repeats[0]
    assert rep.errors == 1
    # The task that could not be created is errored: outside the pass rate, counted apart.
    assert rep.counts["multi_turn_base"] == {"n_pass": 2, "n": 2, "errored": 1}
    assert rep.counts["multi_turn_miss_func"] == {"n_pass": 2, "n": 3, "errored": 0}
    assert rep.counts["overall"] == {"n_pass": 4, "n": 5, "errored": 1}
    saved = json.loads((tmp_path / "eval_summary.json").read_text())
    assert saved["repeats"][0]["counts"]["overall"]["n_pass"] == 4

    # Resume: only the errored task runs again; once it works the summary counts it once.
    env.fail_create.clear()
    policy2 = ScriptedPolicy(wrong={"multi_turn_miss_func_1"})
    summary2 = run_eval(settings, policy2, lambda: env, tmp_path)
    assert policy2.calls == 4  # one task x 2 turns x (call + text)
    assert summary2.repeats[0].counts["overall"] == {"n_pass": 5, "n": 6, "errored": 0} and summary2.repeats[0].errors == 0
    assert len(read_log_file(log)) == 7


def test_repeats_get_seeds_dirs_and_mean_std(tmp_path):
    env = FakeEnv(turns=1)
    settings = EvalSettings(task_ids=_ids(4), repeats=3, seed=10, progress=False, resume=False,
                            sampling=SamplingSettings(temperature=0.7, max_tokens=16))
    policy = ScriptedPolicy(wrong={"multi_turn_base_0"})
    summary = run_eval(settings, policy, lambda: env, tmp_path)
    assert [r.seed for r in summary.repeats] == [10, 11, 12]
    assert {s.seed for s in policy.seen_sampling} == {10, 11, 12}
    assert all(s.temperature == 0.7 for s in policy.seen_sampling)
    for r in range(3):
        recs = read_log_file(tmp_path / f"repeat_{r}" / "validation_log" / "0.jsonl")
        assert len(recs) == 4 and all(x["repeat"] == r for x in recs)
    mean, std = summary.mean_std["overall"]
    assert mean == pytest.approx(0.75) and std == pytest.approx(0.0)


def test_filters_and_bad_settings(tmp_path):
    with pytest.raises(ValueError, match="repeats"):
        EvalSettings(repeats=0)
    env = FakeEnv(turns=1)
    settings = EvalSettings(task_ids=_ids(8), categories=["multi_turn_miss_func"], per_category=2,
                            progress=False)
    summary = run_eval(settings, ScriptedPolicy(), lambda: env, tmp_path)
    assert summary.task_ids == ["multi_turn_miss_func_1", "multi_turn_miss_func_3"]

    class Counting(ScriptedPolicy):
        def count_tokens(self, messages):
            return 100 if messages[0]["content"].endswith(("_0", "_1")) else 10

    settings = EvalSettings(task_ids=_ids(6), max_prompt_tokens=50, limit=3, progress=False)
    summary = run_eval(settings, Counting(), lambda: env, tmp_path / "b")
    assert summary.skipped == {"multi_turn_base_0": 100, "multi_turn_miss_func_1": 100}
    assert summary.task_ids == ["multi_turn_base_2", "multi_turn_miss_func_3", "multi_turn_base_4"]
    with pytest.raises(ValueError, match="tokenizer"):
        run_eval(settings, ScriptedPolicy(), lambda: env, tmp_path / "c")


class OraclePolicy:
    """Answers each task with its ground truth (the environment's oracle messages), by system prompt."""

    def __init__(self, scripts: dict[str, list[str]]) -> None:
        self.scripts, self.played = scripts, {}

    def complete(self, messages, sampling):
        return self.complete_with_usage(messages, sampling).text

    def complete_with_usage(self, messages, sampling):
        key = messages[1]["content"]  # the first user turn names the task's conversation
        queue = self.played.setdefault(key, list(self.scripts[key]))
        text = queue.pop(0) if queue else "Done."
        return Completion(text, prompt_tokens=0, completion_tokens=0, finish_reason="stop")


def test_seal_eval_runs_another_environment_with_its_own_categories(tmp_path):
    # The notes environment, picked by name: its tasks, splits and categories come from its task
    # store (its ids carry no category); every ground truth passes.
    from env_service.client import EnvClient
    from env_service.notes.episode import NotesEpisode, default_store

    store, ids = default_store(), ["notes_000", "notes_016", "notes_020"]
    with EnvClient.in_process(env="notes") as client:
        first_user = {t: client.create(t, {"rollout_mode": "validate"}) for t in ids}
        scripts = {c.messages[1]["content"]: NotesEpisode.oracle(store.get(t))
                   for t, c in first_user.items()}
        for c in first_user.values():
            client.release(c.instance_id)
    settings = EvalSettings(env="notes", task_ids=ids, categories=["single_app", "abstain"], progress=False)
    summary = run_eval(settings, OraclePolicy(scripts), lambda: EnvClient.in_process(env="notes"), tmp_path)
    records = read_log_file(tmp_path / "validation_log" / "0.jsonl")
    assert {r["task_id"]: r["data_source"] for r in records} == {
        t: store.get(t).category for t in ids if store.get(t).category in ("single_app", "abstain")}
    assert len(records) >= 2 and all(r["valid"] for r in records) and summary.repeats[0].errors == 0
    assert {r["split"] for r in records} <= {"train", "val"}
