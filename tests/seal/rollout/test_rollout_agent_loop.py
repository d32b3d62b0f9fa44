"""End to end on CPU: SealAgentLoop against the real environment (in-process) and a scripted server."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from seal.rollout.agent_loop import AGENT_NAME, SealAgentLoop
from seal.rollout.episode_loop import CONTEXT_OVERFLOW, LLM_ERROR, MAX_LLM_CALLS, MAX_LLM_CALLS_PER_TURN
from seal.episode import EpisodeResult
from seal.rollout.tokens import ChatFormat, render
from seal.schema import default_config
from seal_shared.types import FailureTag

# multi_turn_base_100 (TradingBot): turn 1 get_stock_info(symbol='NVDA'); turn 2 fund_account(amount=2203.4).
TASK = "multi_turn_base_100"
CALL_STOCK = '<tool_call>\n{"name": "get_stock_info", "arguments": {"symbol": "NVDA"}}\n</tool_call>'
CALL_FUND = '<tool_call>\n{"name": "fund_account", "arguments": {"amount": 2203.4}}\n</tool_call>'
CALL_BAD_SYMBOL = '<tool_call>\n{"name": "get_stock_info", "arguments": {"symbol": "NOPE"}}\n</tool_call>'
PARSE_ERROR = "<tool_call>\n{not json at all\n</tool_call>"
SAMPLING = {"temperature": 1.0, "top_p": 1.0, "logprobs": True}  # verl passes rollout.calculate_log_probs


def make_config(**rollout: Any) -> Any:
    cfg = default_config()
    cfg.env_service.url = None
    for key, value in rollout.items():
        cfg.seal.rollout[key] = value
    cfg.actor_rollout_ref = {"rollout": {"prompt_length": 8192, "response_length": 2048, "max_model_len": 8192}}
    return cfg


class FlakyClient:
    """The real client, but ``step`` raises EnvUnavailableError on the listed call numbers (1-based)."""

    def __init__(self, client: Any, failing_steps: set[int]) -> None:
        self.client, self.failing_steps, self.steps, self.released = client, failing_steps, 0, []

    def create(self, *a: Any) -> Any:
        return self.client.create(*a)

    def step(self, instance_id: str, content: str) -> Any:
        from env_service.client import EnvUnavailableError

        self.steps += 1
        if self.steps in self.failing_steps:
            raise EnvUnavailableError("connection refused (scripted)", code="connect")
        return self.client.step(instance_id, content)

    def evaluate(self, *a: Any) -> Any:
        return self.client.evaluate(*a)

    def release(self, instance_id: str) -> bool:
        self.released.append(instance_id)
        return self.client.release(instance_id)


def run_episode(cfg: Any, server: Any, tokenizer: Any, client: Any, **row: Any) -> Any:
    async def go() -> Any:
        loop = SealAgentLoop.for_local(cfg, server, tokenizer, env_client=client)
        return await loop.run(dict(SAMPLING), task_id=TASK, rollout_mode="sample", **row)

    return asyncio.run(go())


def check_tokens(out: Any, server: Any, tokenizer: Any) -> None:
    """Mask = exactly the server's tokens; contexts only grow; decoded text = the template rendering."""
    masked = [t for t, m in zip(out.response_ids, out.response_mask) if m]
    assert masked == [t for ids in server.outputs for t in ids]
    full = out.prompt_ids + out.response_ids
    for call in server.calls:
        assert full[: len(call["prompt_ids"])] == call["prompt_ids"]
    fmt = ChatFormat.from_tokenizer(tokenizer)
    tail = fmt.close_ids(out.response_ids)
    assert tokenizer.decode(full + tail) == render(tokenizer, out.extra_fields["messages"], add_generation_prompt=False)


def test_registered_under_its_name() -> None:
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

    # The one name: the release's seal_bfcl is refused by the config pass (below).
    assert AGENT_NAME == "seal" and "seal_bfcl" not in _agent_loop_registry
    assert _agent_loop_registry[AGENT_NAME]["_target_"] == "seal.rollout.agent_loop.SealAgentLoop"


def test_the_releases_name_is_refused_in_one_line_that_names_seal() -> None:
    from seal.config import ConfigError, compose_config
    from seal.trainer.verl.trainer import check_verl_config

    override = "actor_rollout_ref.rollout.agent.default_agent_loop=seal_bfcl"
    with pytest.raises(ConfigError, match="registered as seal") as info:
        check_verl_config(compose_config("exp/SEAL.yaml", [override], check=False))
    assert "\n" not in str(info.value) and str(info.value).endswith("default_agent_loop=seal)")
    with pytest.raises(ConfigError, match="registered as seal"):  # and by the config pass, before a run starts
        compose_config("exp/SEAL.yaml", [override])


def test_perfect_episode(scripted_server: Any, tokenizer: Any, env_client: Any) -> None:
    server = scripted_server([CALL_STOCK, "NVDA trades at its listed price.", CALL_FUND, "Done."])
    out = run_episode(make_config(few_shot=True), server, tokenizer, env_client)
    e = out.extra_fields
    assert out.reward_score == 1.0
    assert EpisodeResult.from_fields(e).tags == (FailureTag.PASS, FailureTag.PASS) and e["check"]["valid"] is True
    assert e["terminated_reason"] == "completed" and e["num_llm_calls"] == 4
    assert not e["env_fault"] and not e["llm_fault"] and not e["excluded"]
    assert e["task_id"] == TASK and e["category"] == "multi_turn_base"
    assert out.num_turns == 1 + 4 + 3
    assert len(out.response_logprobs) == len(out.response_ids) == len(out.response_mask)
    assert "[Example]" in e["messages"][1]["content"]  # few-shot examples sit after the system prompt
    assert server.calls[0]["sampling_params"]["temperature"] == 1.0
    check_tokens(out, server, tokenizer)


def test_tool_error_parse_error_and_plain_replies(scripted_server: Any, tokenizer: Any, env_client: Any) -> None:
    server = scripted_server([CALL_BAD_SYMBOL, PARSE_ERROR, "I could not find it.", "Nothing more."])
    out = run_episode(make_config(), server, tokenizer, env_client)
    e = out.extra_fields
    assert out.reward_score == 0.0 and e["check"]["valid"] is False
    tags = EpisodeResult.from_fields(e).tags
    assert list(tags) == e["check"]["failure_tags"] and len(tags) == 2
    assert tags[1] == FailureTag.EMPTY_TURN_MODEL_RESPONSE  # no call at all in turn 2
    observations = [m["content"] for m in e["messages"][2:] if m["role"] == "user"]
    assert "<tool_response>" in observations[0] and "Invalid tool call format" in observations[1]
    assert e["check"]["events"]["parse_errors"] >= 1 and e["check"]["events"]["tool_errors"] >= 1
    assert sum(out.response_mask) > 0
    check_tokens(out, server, tokenizer)


@pytest.mark.parametrize("failure", ["<FAIL>", "<ABORT>"])
def test_llm_failure_is_excluded(scripted_server: Any, tokenizer: Any, env_client: Any, failure: str) -> None:
    server = scripted_server([CALL_STOCK, failure])
    client = FlakyClient(env_client, set())
    out = run_episode(make_config(), server, tokenizer, client)
    e = out.extra_fields
    assert e["llm_fault"] and e["excluded"] and e["terminated_reason"] == LLM_ERROR
    assert set(out.response_mask) == {0} and out.reward_score == 0.0
    assert len(client.released) == 1  # released even though the episode failed


def test_env_fault_retries_then_succeeds(scripted_server: Any, tokenizer: Any, env_client: Any) -> None:
    script = [CALL_STOCK, "x", CALL_STOCK, "NVDA trades at its listed price.", CALL_FUND, "Done."]
    server = scripted_server(script)
    client = FlakyClient(env_client, {2})
    out = run_episode(make_config(), server, tokenizer, client)
    e = out.extra_fields
    assert e["env_attempts"] == 2 and not e["env_fault"] and out.reward_score == 1.0
    assert len(client.released) == 2  # the failed attempt's instance was released too


def test_env_fault_after_retries(scripted_server: Any, tokenizer: Any, env_client: Any) -> None:
    server = scripted_server([], default=CALL_STOCK)
    client = FlakyClient(env_client, {1, 2})
    out = run_episode(make_config(env_retries=1), server, tokenizer, client)
    e = out.extra_fields
    assert e["env_fault"] and e["excluded"] and e["env_attempts"] == 2 and e["terminated_reason"] == "env_error"
    assert set(out.response_mask) <= {0} and out.reward_score == 0.0
    assert "connection refused" in e["error"]


class DownClient(FlakyClient):
    """No instance can ever be created: the environment is unreachable from the first call."""

    def create(self, *a: Any) -> Any:
        from env_service.client import EnvUnavailableError

        raise EnvUnavailableError("connection refused (scripted)", code="connect")


@pytest.mark.parametrize(("row", "category"), [({"data_source": "kitchen"}, "kitchen"),
                                               ({"category": "kitchen"}, "kitchen"), ({}, "unknown")])
def test_a_fault_before_create_keeps_the_callers_category(scripted_server: Any, tokenizer: Any, env_client: Any,
                                                         row: dict, category: str) -> None:
    """An episode that never got an instance has no category from the environment: it keeps the
    dataset row's (verl: data_source; local: category), and an id that is not BFCL-shaped does not
    crash the batch."""
    async def go() -> Any:
        loop = SealAgentLoop.for_local(make_config(env_retries=0), scripted_server([], default=CALL_STOCK),
                                       tokenizer, env_client=DownClient(env_client, set()))
        return await loop.run(dict(SAMPLING), task_id="pantry-restock", rollout_mode="sample", **row)

    result = EpisodeResult.from_fields(asyncio.run(go()).extra_fields)
    assert result.env_fault and result.excluded and result.category == category


def test_episode_call_cap(scripted_server: Any, tokenizer: Any, env_client: Any) -> None:
    server = scripted_server([], default=CALL_STOCK)
    cfg = make_config()
    cfg.actor_rollout_ref.rollout.update(response_length=8192, max_model_len=16384)  # room for 20 calls
    out = run_episode(cfg, server, tokenizer, env_client)
    e = out.extra_fields
    assert e["num_llm_calls"] == 20 == len(server.calls)
    assert e["terminated_reason"] == MAX_LLM_CALLS and not e["excluded"]
    check_tokens(out, server, tokenizer)


def test_per_turn_cap(scripted_server: Any, tokenizer: Any, env_client: Any) -> None:
    server = scripted_server([], default=CALL_STOCK)
    out = run_episode(make_config(max_llm_calls_per_turn=3), server, tokenizer, env_client)
    assert out.extra_fields["num_llm_calls"] == 3
    assert out.extra_fields["terminated_reason"] == MAX_LLM_CALLS_PER_TURN


def test_release_context_budget(scripted_server: Any, tokenizer: Any, env_client: Any) -> None:
    """The release's budget: calls go on until the raw context reaches max_model_len -
    response_length; the episode is scored whole, the tensors keep response_length tokens."""
    cfg = make_config()
    prompt = run_episode(make_config(), scripted_server(["Done."] * 3), tokenizer, env_client).prompt_ids
    cfg.actor_rollout_ref.rollout.response_length = 200
    cfg.actor_rollout_ref.rollout.max_model_len = len(prompt) + 600 + 200  # context cap: prompt + 600
    server = scripted_server([], default=CALL_STOCK)
    out = run_episode(cfg, server, tokenizer, env_client)
    e = out.extra_fields
    assert e["terminated_reason"] == CONTEXT_OVERFLOW and not e["excluded"]
    cap = len(prompt) + 600
    for call in server.calls:  # no call started at the cap; none could pass max_model_len
        assert len(call["prompt_ids"]) < cap
        assert len(call["prompt_ids"]) + call["sampling_params"]["max_tokens"] <= cap + 200
    played = max(len(c["prompt_ids"]) for c in server.calls) - len(prompt)
    assert played > 200  # the episode went on past response_length ...
    assert len(out.response_ids) == len(out.response_mask) == len(out.response_logprobs) == 200  # ... cut here
    assert e["truncated_response_tokens"] > 0


def test_response_budget(scripted_server: Any, tokenizer: Any, env_client: Any) -> None:
    cfg = make_config(episode_budget="response")
    cfg.actor_rollout_ref.rollout.response_length = 200
    server = scripted_server([], default=CALL_STOCK)
    out = run_episode(cfg, server, tokenizer, env_client)
    e = out.extra_fields
    assert e["terminated_reason"] == CONTEXT_OVERFLOW and not e["excluded"]
    assert 0 < len(out.response_ids) <= 200 and e["num_llm_calls"] < 20
    for call in server.calls:  # each call was told how much room was left
        assert len(call["prompt_ids"]) - len(out.prompt_ids) + call["sampling_params"]["max_tokens"] <= 200


def test_cut_generation_respects_per_call_tokens(scripted_server: Any, tokenizer: Any, env_client: Any) -> None:
    server = scripted_server([("a reply that is far too long " * 20), "Done.", "Done."])
    out = run_episode(make_config(max_tokens_per_call=16), server, tokenizer, env_client)
    assert all(c["sampling_params"]["max_tokens"] == 16 for c in server.calls)
    assert len(server.outputs[0]) == 16
    check_tokens(out, server, tokenizer)


def test_env_params_reach_the_environment(scripted_server: Any, tokenizer: Any, env_client: Any) -> None:
    server = scripted_server([PARSE_ERROR])
    out = run_episode(make_config(), server, tokenizer, env_client, env_params={"terminate_on_parse_error": True})
    e = out.extra_fields
    assert e["terminated_reason"] == "parse_error" and e["num_llm_calls"] == 1


def test_bad_task_id_is_a_clear_error(scripted_server: Any, tokenizer: Any, env_client: Any) -> None:
    async def go() -> Any:
        loop = SealAgentLoop.for_local(make_config(), scripted_server([]), tokenizer, env_client=env_client)
        return await loop.run(dict(SAMPLING), task_id="no_such_task")

    with pytest.raises(ValueError, match="no_such_task"):
        asyncio.run(go())


def test_every_episode_carries_the_validation_record(scripted_server: Any, tokenizer: Any, env_client: Any) -> None:
    """verl builds one batch column per reward_extra_info key, keyed by the first episode: faulted
    episodes must carry the same key, and the verl backend's dump must read the records back."""
    import json

    from seal.trainer.verl.validation import RECORD_KEY, validation_records

    good = run_episode(make_config(), scripted_server([CALL_STOCK, "NVDA trades at its listed price.",
                                                       CALL_FUND, "Done."]), tokenizer, env_client)
    llm_fault = run_episode(make_config(), scripted_server([CALL_STOCK, "<FAIL>"]), tokenizer, env_client)
    env_fault = run_episode(make_config(env_retries=0), scripted_server([], default=CALL_STOCK), tokenizer,
                            FlakyClient(env_client, {1}))
    outs = [good, llm_fault, env_fault]
    infos = [o.extra_fields["reward_extra_info"] for o in outs]
    assert all(list(info) == [RECORD_KEY] and isinstance(info[RECORD_KEY], str) for info in infos)
    records = validation_records([info[RECORD_KEY] for info in infos], [o.reward_score for o in outs], step=5,
                                 generation={"temperature": 0.0})
    assert [(r.task_id, r.valid, r.score) for r in records] == [(TASK, True, 1.0), (TASK, False, 0.0),
                                                                (TASK, False, 0.0)]
    first = records[0]
    assert first.data_source == "multi_turn_base" and first.tags == [FailureTag.PASS, FailureTag.PASS]
    assert first.num_llm_calls == 4 and first.terminated_reason == "completed" and first.error is None
    assert first.num_prompt_tokens == len(good.prompt_ids) and first.num_response_tokens == sum(good.response_mask)
    assert first.messages == good.extra_fields["messages"]
    assert first.model_turns == good.extra_fields["check"]["model_turns"] and len(first.model_turns) == 2
    assert records[1].error.startswith("LLM fault") and records[1].terminated_reason == LLM_ERROR
    assert records[2].error.startswith("environment fault") and records[2].terminated_reason == "env_error"
    raw = [EpisodeResult.from_fields(json.loads(info[RECORD_KEY])) for info in infos]
    assert [(r.env_fault, r.llm_fault) for r in raw] == [(False, False), (False, True), (True, False)]
    # The column holds the same record as the episode's extra_fields (the trainers' form).
    assert raw == [EpisodeResult.from_fields(o.extra_fields) for o in outs]


def test_validation_scores_are_binary_whatever_the_training_reward(scripted_server: Any, tokenizer: Any,
                                                                   env_client: Any) -> None:
    """Turn 1 solved, turn 2 not: the dense training reward gives partial credit, a validation
    episode of the same play scores 0 (the paper's tables are binary pass rates)."""
    script = [CALL_STOCK, "NVDA trades at its listed price.", "I will not fund it.", "Done."]
    cfg = make_config()
    cfg.seal.reward.mode = "capped"

    async def go(mode: str) -> Any:
        loop = SealAgentLoop.for_local(cfg, scripted_server(list(script)), tokenizer, env_client=env_client)
        return await loop.run(dict(SAMPLING), task_id=TASK, rollout_mode=mode)

    train, val = asyncio.run(go("sample")), asyncio.run(go("validate"))
    assert train.extra_fields["check"]["valid"] is False and val.extra_fields["check"]["valid"] is False
    assert 0.0 < train.reward_score < 1.0 and train.extra_fields["reward_meta"]["mode"] == "capped"
    assert val.reward_score == 0.0 and val.extra_fields["reward_meta"]["mode"] == "binary"


def test_verl_validation_log_scores_the_verdict_not_a_partial_reward() -> None:
    import json

    from seal.episode import Evaluation
    from seal.trainer.verl.validation import validation_records

    result = EpisodeResult(TASK, "multi_turn_base", evaluation=Evaluation.from_wire(
        {"valid": False, "failure_tags": ["pass", "state_mismatch"]}), reward=0.35)
    (line,) = validation_records([json.dumps(result.to_fields())], [0.35], step=1, generation={})
    assert (line.score, line.reward, line.valid) == (0.0, 0.35, False)


def test_observations_take_the_role_the_environment_names(scripted_server: Any, tokenizer: Any,
                                                         env_client: Any) -> None:
    # The ToolACE prompt mode returns its observations in ipython messages (its /create info says
    # so): the runner's messages and tokens carry that role. As in the release, every observation of
    # such an episode has it, the next turn's query included (the release's /step state role).
    server = scripted_server(["[get_stock_info(symbol='NVDA')]", "NVDA trades at its listed price.",
                              "[fund_account(amount=2203.4)]", "Done."])
    out = run_episode(make_config(), server, tokenizer, env_client, env_params={"tool_prompt_mode": "toolace_fc", "tool_call_parser": "toolace_fc",
                                                                "tool_result_mode": "toolace_official_prompt"})
    e = out.extra_fields
    assert out.reward_score == 1.0 and e["terminated_reason"] == "completed"
    roles = [m["role"] for m in e["messages"]]
    assert roles[:2] == ["system", "user"] and set(roles[2::2]) == {"assistant"} and set(roles[3::2]) == {"ipython"}
    assert tokenizer.decode(out.response_ids).count("<|im_start|>ipython") == roles.count("ipython") == 3
    check_tokens(out, server, tokenizer)


def test_each_call_keeps_its_turn_and_turn_credit_reads_it(scripted_server: Any, tokenizer: Any,
                                                           env_client: Any) -> None:
    import torch

    from seal.advantage.turn_credit import credit_turns, model_runs

    # Turn 1 done right (a call, then an answer); turn 2 answered without its call: failed.
    server = scripted_server([CALL_STOCK, "NVDA trades at its listed price.", "I will not fund it."])
    out = run_episode(make_config(), server, tokenizer, env_client)
    record = EpisodeResult.from_fields(out.extra_fields)
    assert record.tags == (FailureTag.PASS, FailureTag.EMPTY_TURN_MODEL_RESPONSE) and out.reward_score == 0.0
    assert record.call_turns == (0, 0, 1)
    mask = torch.tensor([out.response_mask], dtype=torch.float32)
    runs = model_runs(mask[0])
    assert [end - start for start, end in runs] == [len(ids) for ids in server.outputs]

    credited, metrics = credit_turns(-mask, mask, [record.call_turns], [list(record.tags)])
    turn_two = runs[2]
    assert credited[0, : turn_two[0]].eq(0).all()  # the right turn is not pushed down
    assert credited[0, turn_two[0]: turn_two[1]].eq(-1).all()  # the failed one is
    assert metrics["seal/turn_credit/unattributed_rows"] == 0.0
