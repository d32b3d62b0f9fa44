"""Batches of mixed episodes through verl's own rollout and step code, as the GPU run met them.

verl's ``AgentLoopManager`` splits a batch across agent-loop workers, each worker post-processes
its episodes into one ``DataProto`` and the manager concatenates the chunks: every episode must
carry the same fields whatever happened to it (the first GPU run crashed here at its first
validation). Then verl's real ``RayPPOTrainer.fit()`` runs a training step on such a batch —
old/ref log-probs, rollout correction as exp/SEAL.yaml configures it, GRPO advantages, the SEAL
step, the actor update — with only the worker groups (FSDP, vLLM) standing in. A batch with
nothing to train on (every prompt over ``data.max_prompt_length``: the GPU run's second crash)
is skipped and counted, never a crash.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from seal.config import REPO_ROOT, compose_config

pytest.importorskip("verl")

from verl import DataProto  # noqa: E402
from verl.utils.dataset.rl_dataset import collate_fn  # noqa: E402

from seal.rollout.episode_loop import CONTEXT_OVERFLOW, LLM_ERROR, PROMPT_OVERFLOW  # noqa: E402
from seal.trainer.verl.dataset import TaskDataset  # noqa: E402
from verl_fakes import ActorWorkers, CheckpointEngine, RefWorkers, RoutedServer, rollout_manager  # noqa: E402
from verl_testkit import make_trainer  # noqa: E402

MODEL_DIR = REPO_ROOT / "models" / "SmolLM2-135M-Instruct"
CALL_STOCK = '<tool_call>\n{"name": "get_stock_info", "arguments": {"symbol": "NVDA"}}\n</tool_call>'
CALL_FUND = '<tool_call>\n{"name": "fund_account", "arguments": {"amount": 2203.4}}\n</tool_call>'

# Prompt tokens (SmolLM2, training interface): the first four fit data.max_prompt_length=4096,
# multi_turn_miss_param_2 (5,537) does not.
SOLVED = "multi_turn_base_100"           # solves both turns; its first instance's environment fails
WRONG = "multi_turn_base_1"              # answers in prose: completes, fails
LLM_DOWN = "multi_turn_base_3"           # the server raises
OVERLONG = "multi_turn_miss_param_2"     # prompt over max_prompt_length: no LLM call at all
FLOOD = "multi_turn_base_105"            # each call writes response_length tokens: over the context cap
ABORTED = "multi_turn_base_116"          # the server aborts the generation
TASKS = [SOLVED, WRONG, LLM_DOWN, OVERLONG, FLOOD, ABORTED]
SCRIPTS = {SOLVED: [CALL_STOCK, "NVDA trades at its listed price.", CALL_FUND, "Done."],
           WRONG: ["I cannot help."] * 6, LLM_DOWN: ["raise"], OVERLONG: ["Done."], FLOOD: ["flood"] * 3,
           ABORTED: ["abort"]}
N = 2


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    if not (MODEL_DIR / "tokenizer.json").is_file():
        pytest.skip("models/SmolLM2-135M-Instruct is missing; run install.sh")
    from verl.utils.tokenizer.tokenizer import hf_tokenizer

    return hf_tokenizer(str(MODEL_DIR))


def seal_config(*extra: str) -> Any:
    """exp/SEAL.yaml shrunk to SmolLM2's 8k context; one attempt per episode (the scripted
    environment fault is not retried away)."""
    return compose_config("exp/SEAL.yaml", [
        "env_service.url=null", f"actor_rollout_ref.model.path={MODEL_DIR}", f"actor_rollout_ref.rollout.n={N}", "data.max_prompt_length=4096",
        "data.max_response_length=2048", "actor_rollout_ref.rollout.max_model_len=8192",
        "seal.rollout.env_retries=0", "trainer.logger=[console]", "trainer.val_before_train=false",
        "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.resume_mode=disable",
        # One process, and the whole step one mini-batch (verl's batch arithmetic, checked by the config pass).
        f"data.train_batch_size={len(TASKS)}", f"actor_rollout_ref.actor.ppo_mini_batch_size={len(TASKS)}",
        "trainer.n_gpus_per_node=1", *extra])


class _FirstInstanceFails:
    """The real in-process client, except that ``step`` on the first instance of ``task`` fails
    as an unreachable service does."""

    def __init__(self, client: Any, task: str, state: dict) -> None:
        self.client, self.task, self.state = client, task, state

    def create(self, task_id: str, params: Any = None) -> Any:
        created = self.client.create(task_id, params)
        if task_id == self.task and not self.state.get("failed_one"):
            self.state["failed_one"] = created.instance_id
        return created

    def step(self, instance_id: str, content: str) -> Any:
        from env_service.client import EnvUnavailableError

        if instance_id == self.state.get("failed_one"):
            raise EnvUnavailableError("connection refused (scripted)", code="connect")
        return self.client.step(instance_id, content)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)

    def close(self) -> None:
        pass


@pytest.fixture
def flaky_environment(monkeypatch):
    """Every episode's environment client (the runner builds one per episode, as on the GPU)."""
    from env_service.client import EnvClient

    client, state = EnvClient.in_process(), {}
    monkeypatch.setattr("seal.rollout.agent_loop.make_env_client",
                        lambda cfg: _FirstInstanceFails(client, SOLVED, state))
    yield state
    client.close()


def routed_server(tokenizer: Any) -> RoutedServer:
    from env_service.client import EnvClient

    client = EnvClient.in_process()
    snippets = {}
    try:
        for task in TASKS:
            created = client.create(task, {"rollout_mode": "sample"})
            question = next(m["content"] for m in created.messages if m["role"] == "user")
            snippets[question[:80]] = SCRIPTS[task]
            client.release(created.instance_id)
    finally:
        client.close()
    return RoutedServer(tokenizer, tokenizer.convert_tokens_to_ids("<|im_end|>"), snippets)


def generation_batch(cfg: Any, tasks: list[str], tmp_path: Path) -> tuple[Any, Any]:
    """The training batch as fit() holds it before rollout, and its generation batch."""
    dataset = TaskDataset(tasks, rollout_mode="sample")
    batch = DataProto.from_single_dict(collate_fn([dataset[i] for i in range(len(dataset))]))
    batch.non_tensor_batch["uid"] = np.array([f"uid-{t}" for t in tasks], dtype=object)
    trainer = make_trainer(cfg, tmp_path, step=1)
    gen = trainer._get_gen_batch(batch).repeat(repeat_times=N, interleave=True)
    return batch, gen


def test_mixed_episodes_concatenate_across_workers(tokenizer, flaky_environment, tmp_path, caplog):
    cfg = seal_config()
    _, gen = generation_batch(cfg, TASKS, tmp_path)
    with caplog.at_level("INFO", logger="verl.utils.tokenizer.continuous_token_wiring"):
        out = rollout_manager(cfg, tokenizer, routed_server(tokenizer)).generate_sequences(gen)
    # verl builds a tokenisation builder per episode: its choice is logged once, not 12 times,
    # and names the checkpoint's model type (read from its config.json, not None).
    builder_lines = [r.getMessage() for r in caplog.records if "Continuous Token builder" in r.getMessage()]
    assert len(builder_lines) == len(set(builder_lines)) <= 3
    assert not any("model_type=None" in m for m in builder_lines)

    assert len(out) == len(TASKS) * N
    reasons = dict(zip(out.non_tensor_batch["task_id"], out.non_tensor_batch["terminated_reason"]))
    assert reasons[OVERLONG] == PROMPT_OVERFLOW and reasons[FLOOD] == CONTEXT_OVERFLOW
    assert reasons[LLM_DOWN] == LLM_ERROR and reasons[ABORTED] == LLM_ERROR
    # Every chunk kept the sampler's log-probs, aligned with the response; zero off the model's tokens.
    logprobs, mask = out.batch["rollout_log_probs"], out.batch["response_mask"]
    assert logprobs.shape == mask.shape
    kept = ~torch.tensor([bool(x) for x in out.non_tensor_batch["excluded"]])
    assert bool((logprobs[kept][mask[kept] == 0] == 0).all()) and bool((logprobs[mask == 1] == -0.5).all())
    excluded = {t: bool(x) for t, x in zip(out.non_tensor_batch["task_id"], out.non_tensor_batch["excluded"])}
    assert excluded == {SOLVED: False, WRONG: False, LLM_DOWN: True, OVERLONG: True, FLOOD: False, ABORTED: True}
    env_faults = [t for t, f in zip(out.non_tensor_batch["task_id"], out.non_tensor_batch["env_fault"]) if f]
    assert env_faults == [SOLVED]
    # Excluded episodes carry no trainable token; the context-overflowed one is trained on.
    rows = {t: i for i, t in enumerate(out.non_tensor_batch["task_id"])}
    assert int(mask[rows[OVERLONG]].sum()) == 0 and int(mask[rows[FLOOD]].sum()) > 1000
    # The flooded episode went past response_length (the release's budget is the whole context)
    # and its training tensors were cut to it.
    cut = dict(zip(out.non_tensor_batch["task_id"], out.non_tensor_batch["truncated_response_tokens"]))
    assert cut[FLOOD] > 0 and cut[WRONG] == 0
    assert out.batch["responses"].shape[1] == 2048 and out.batch["prompts"].shape[1] == 4096


def test_missing_logprobs_make_an_llm_fault_not_a_ragged_batch(tokenizer, flaky_environment, tmp_path):
    cfg = seal_config()
    _, gen = generation_batch(cfg, [WRONG, FLOOD], tmp_path)
    server = routed_server(tokenizer)
    for script in server.behaviours.values():
        if script[0] == "flood":
            script[:] = ["nologprobs"]
    out = rollout_manager(cfg, tokenizer, server).generate_sequences(gen)
    assert "rollout_log_probs" in out.batch.keys()
    faults = dict(zip(out.non_tensor_batch["task_id"], out.non_tensor_batch["llm_fault"]))
    assert faults == {WRONG: False, FLOOD: True}


def test_without_logprobs_requested_no_episode_has_them(tokenizer, flaky_environment, tmp_path):
    cfg = seal_config("actor_rollout_ref.rollout.calculate_log_probs=false")
    _, gen = generation_batch(cfg, [WRONG, OVERLONG], tmp_path)
    out = rollout_manager(cfg, tokenizer, routed_server(tokenizer)).generate_sequences(gen)
    assert "rollout_log_probs" not in out.batch.keys() and len(out) == 2 * N


# --------------------------------------------------------------------------- verl's fit()


def fit_one_step(cfg: Any, tasks: list[str], tokenizer: Any, tmp_path: Path) -> Any:
    """verl's ``RayPPOTrainer.fit`` for one step on ``SealRayPPOTrainer``; returns the trainer
    and the metrics verl logged."""
    trainer = make_trainer(cfg, tmp_path / "run", step=0, steps_per_epoch=1, total_steps=1)
    dataset = TaskDataset(tasks, rollout_mode="sample")
    trainer.train_dataloader = [collate_fn([dataset[i] for i in range(len(dataset))])]
    trainer.train_dataset = dataset
    trainer.async_rollout_manager = rollout_manager(cfg, tokenizer, routed_server(tokenizer))
    trainer.actor_rollout_wg, trainer.ref_policy_wg = ActorWorkers(), RefWorkers()
    trainer.checkpoint_manager = CheckpointEngine()
    trainer.use_rm, trainer.use_critic, trainer.use_reference_policy, trainer.ref_in_actor = False, False, True, False
    trainer.distillation_config = None
    trainer.resource_pool_manager = type("Pools", (), {"get_n_gpus": lambda self: 1})()
    trainer._init_dump_executor()
    logged: list[dict] = []
    from verl.utils import tracking

    class Tracking:
        def __init__(self, *a: Any, **k: Any) -> None:
            pass

        def log(self, data: dict, step: int) -> None:
            logged.append(dict(data))

    original = tracking.Tracking
    tracking.Tracking = Tracking
    try:
        trainer.fit()
    finally:
        tracking.Tracking = original
    return trainer, logged[-1]


def test_verls_fit_trains_a_mixed_batch_on_the_kept_episodes_only(tokenizer, flaky_environment, tmp_path):
    cfg = seal_config()
    trainer, metrics = fit_one_step(cfg, TASKS, tokenizer, tmp_path)

    (sent,) = trainer.actor_rollout_wg.updates  # one actor update, by verl's _update_actor
    task_ids = list(sent["task_id"])
    loss_rows = {t: bool(m.values().any()) if m.is_nested else bool(m.any())
                 for t, m in zip(task_ids, sent["loss_mask"].unbind(0))}
    # Faults, the overflowed prompt and SOLVED's lone survivor (its sibling's environment failed)
    # are not trained on; the two complete groups are.
    assert loss_rows == {SOLVED: False, WRONG: True, LLM_DOWN: False, OVERLONG: False, FLOOD: True, ABORTED: False}
    assert metrics["seal/excluded_episodes"] == 7 and metrics["seal/lone_survivors"] == 1
    assert metrics["seal/trained_episodes"] == 4 and metrics["seal/skipped_updates"] == 0
    assert metrics["actor/pg_loss"] == 0.5 and metrics["seal/truncated_episodes"] == N  # FLOOD's two
    assert any(k.startswith("rollout_corr/") for k in metrics)  # verl's rollout correction ran
    assert trainer.coevolution.state.observe_count == 5  # 12 minus the 7 excluded: the lone survivor counts
    assert trainer.checkpoint_manager.synced[-1] == 1


def test_verls_fit_skips_a_step_with_nothing_to_train_on(tokenizer, flaky_environment, tmp_path, caplog):
    # Every prompt is longer than data.max_prompt_length: no response token in the whole batch.
    cfg = seal_config("data.max_prompt_length=1024")
    with caplog.at_level("WARNING"):
        trainer, metrics = fit_one_step(cfg, [SOLVED, WRONG], tokenizer, tmp_path)

    assert trainer.actor_rollout_wg.updates == [] and trainer.actor_rollout_wg.log_prob_calls == 0
    assert trainer.ref_policy_wg.calls == 0
    assert metrics["seal/skipped_updates"] == 1.0 and metrics["seal/excluded_episodes"] == 2 * N
    assert "actor/pg_loss" not in metrics and not any(k.startswith("rollout_corr/") for k in metrics)
    assert any("no episode left to train on" in r.getMessage() for r in caplog.records)
    assert trainer.checkpoint_manager.synced[-1] == 1  # the rollout servers still get the weights
    assert torch.isnan(torch.tensor(metrics["critic/advantages/mean"]))  # verl's metrics of an empty batch


def test_verls_fit_reads_the_step_once(tokenizer, flaky_environment, tmp_path, monkeypatch):
    """The step rules run once and the records are read once per step, although three SEAL
    hooks (old and reference log-probs, the actor update) use them; verl's compute_advantage
    runs the SEAL estimator once."""
    from verl.trainer.ppo import core_algos

    from seal.advantage.grpo import SEAL_GRPO
    from seal.trainer.verl import batch as seal_batch

    calls = {"select_trainable": 0, "episode_results": 0, SEAL_GRPO: 0}

    def counted(name: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    for name in ("select_trainable", "episode_results"):
        monkeypatch.setattr(seal_batch, name, counted(name, getattr(seal_batch, name)))
    monkeypatch.setitem(core_algos.ADV_ESTIMATOR_REGISTRY, SEAL_GRPO,
                        counted(SEAL_GRPO, core_algos.ADV_ESTIMATOR_REGISTRY[SEAL_GRPO]))
    trainer, metrics = fit_one_step(seal_config(), TASKS, tokenizer, tmp_path)

    assert calls == {"select_trainable": 1, "episode_results": 1, SEAL_GRPO: 1}
    assert trainer.config.algorithm.adv_estimator == SEAL_GRPO
    assert metrics["seal/excluded_episodes"] == 7 and metrics["seal/lone_survivors"] == 1
