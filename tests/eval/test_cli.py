"""The ``seal`` console script and ``python -m seal.eval``: argument checks and help."""

from __future__ import annotations

import subprocess
import sys

import pytest

from seal.cli import build_parser, main, settings_from_args


def test_eval_needs_exactly_one_policy_source():
    with pytest.raises(SystemExit, match="exactly one of --model"):
        main(["eval", "--tasks", "multi_turn_base_4"])
    with pytest.raises(SystemExit, match="exactly one of --model"):
        main(["eval", "--model", "m", "--endpoint", "http://x/v1", "--tasks", "multi_turn_base_4"])
    with pytest.raises(SystemExit, match="--served-model"):
        main(["eval", "--endpoint", "http://x/v1", "--tasks", "multi_turn_base_4"])
    with pytest.raises(SystemExit, match="not a directory"):
        main(["eval", "--model", "no/such/dir", "--tasks", "multi_turn_base_4"])


def test_settings_from_arguments():
    args = build_parser().parse_args([
        "eval", "--endpoint", "http://x/v1", "--served-model", "m", "--tasks", "a_1, b_2", "--repeats", "3",
        "--seed", "7", "--temperature", "0.5", "--max-new-tokens", "64", "--max-llm-calls", "5",
        "--params", '{"tool_call_parser": "xml_json"}', "--fresh", "--step", "30"])
    s = settings_from_args(args)
    assert s.task_ids == ["a_1", "b_2"] and s.repeats == 3 and s.seed == 7 and s.step == 30
    assert s.sampling.temperature == 0.5 and s.sampling.max_tokens == 64 and s.max_llm_calls == 5
    params = s.episode_params()  # the config's validation params, --params on top
    assert s.resume is False and params["tool_call_parser"] == "xml_json" and params["rollout_mode"] == "validate"
    assert params["tool_prompt_mode"] == "bfcl_qwen_fc" and s.env == "bfcl"
    bad = build_parser().parse_args(["eval", "--endpoint", "http://x/v1", "--params", "[1]"])
    with pytest.raises(SystemExit, match="JSON object"):
        settings_from_args(bad)


def test_python_dash_m_seal_eval_is_the_eval_subcommand():
    out = subprocess.run([sys.executable, "-m", "seal.eval", "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "usage: seal eval" in out.stdout and "--repeats" in out.stdout


def test_the_episode_budget_comes_from_the_experiment_config():
    # Default: the paper recipe's budget (exp/SEAL.yaml), the same keys the trainers read.
    s = settings_from_args(build_parser().parse_args(["eval", "--endpoint", "http://x/v1", "--served-model", "m"]))
    assert (s.budget.episode_budget, s.budget.max_model_len, s.budget.response_length) == ("context", 16384, 4096)
    assert s.budget.context_cap == 12288 and s.max_llm_calls == 20 and s.sampling.max_tokens == 4096
    args = build_parser().parse_args([
        "eval", "--endpoint", "http://x/v1", "--served-model", "m", "--conf", "exp/quickstart_bfcl.yaml",
        "--set", "actor_rollout_ref.rollout.max_model_len=6000", "--set", "seal.rollout.episode_budget=response"])
    s = settings_from_args(args)
    assert s.budget.max_model_len == 6000 and s.budget.episode_budget == "response"
    assert s.max_llm_calls == 8 and s.sampling.max_tokens == 160  # quickstart_bfcl's max_llm_calls, max_tokens_per_call
    bad = build_parser().parse_args(["eval", "--endpoint", "http://x/v1", "--conf", "exp/nope.yaml"])
    with pytest.raises(SystemExit, match="--conf exp/nope.yaml"):
        settings_from_args(bad)


def test_the_environment_and_its_params_come_from_the_experiment_config():
    args = build_parser().parse_args(["eval", "--endpoint", "http://x/v1", "--served-model", "m",
                                      "--conf", "exp/examples/notes.yaml", "--params", '{"max_steps_per_turn": 3}'])
    s = settings_from_args(args)
    assert s.env == "notes" and s.episode_params()["max_steps_per_turn"] == 3
    assert s.episode_params()["rollout_mode"] == "validate" and "tool_prompt_mode" not in s.episode_params()
