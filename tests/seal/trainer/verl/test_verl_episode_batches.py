"""Batches of mixed episodes through verl's own V1 rollout and step code, as the GPU run met them.

verl's ``AgentLoopManagerTQ`` splits a step's prompts across agent-loop workers; each worker plays
``rollout.n`` episodes per prompt and puts each one into TransferQueue on its own, and the trainer
reads the step's fields over all of them at once: every episode must carry the same fields
whatever happened to it (the first GPU run crashed on a batch of mixed episodes). Then verl's real
V1 ``fit()`` runs a training step on such a batch — the dispatch, the replay buffer, old/ref
log-probs, rollout correction as exp/SEAL.yaml configures it, GRPO advantages, the SEAL step, the
actor update, the step's metrics — with only the worker groups (FSDP, vLLM) standing in. A batch
with nothing to train on (every prompt over ``data.max_prompt_length``: the GPU run's second
crash) is skipped and counted, never a crash.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from seal.config import REPO_ROOT, compose_config

pytest.importorskip("verl")

from verl.utils.dataset.rl_dataset import collate_fn  # noqa: E402

from seal.rollout.episode_loop import CONTEXT_OVERFLOW, LLM_ERROR, PROMPT_OVERFLOW  # noqa: E402
from seal.trainer.verl.dataset import TaskDataset  # noqa: E402
from verl_fakes import RoutedServer, dispatch, rollout_manager  # noqa: E402
from verl_testkit import FakeLoader, clear_partition, make_trainer  # noqa: E402

pytestmark = pytest.mark.usefixtures("transfer_queue")

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


def seal_config(*extra: str, tasks: int = len(TASKS)) -> Any:
    """exp/SEAL.yaml shrunk to SmolLM2's 8k context, ``tasks`` prompts a step; one attempt per
    episode (the scripted environment fault is not retried away)."""
    return compose_config("exp/SEAL.yaml", [
        "env_service.url=null", f"actor_rollout_ref.model.path={MODEL_DIR}", f"actor_rollout_ref.rollout.n={N}", "data.max_prompt_length=4096",
        "data.max_response_length=2048", "actor_rollout_ref.rollout.max_model_len=8192",
        "seal.rollout.env_retries=0", "trainer.logger=[console]", "trainer.val_before_train=false",
        "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.resume_mode=disable",
        # One process, and the whole step one mini-batch (verl's batch arithmetic, checked by the config pass).
        f"data.train_batch_size={tasks}", f"actor_rollout_ref.actor.ppo_mini_batch_size={tasks}",
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


def rows_of(tasks: list[str]) -> list[dict]:
    dataset = TaskDataset(tasks, rollout_mode="sample")
    return [dataset[i] for i in range(len(dataset))]


def play(cfg: Any, tasks: list[str], tokenizer: Any, tmp_path: Path, server: Any = None) -> dict[str, list]:
    """One step's prompts dispatched as ``fit`` does, played by verl's agent-loop workers into
    TransferQueue; every field of every episode, read back in one call (as the trainer's step reads them)."""
    import transfer_queue as tq

    clear_partition()
    trainer = make_trainer(cfg, tmp_path, step=1, rollout_n=None)
    keys = dispatch(trainer, rows_of(tasks), rollout_manager(cfg, tokenizer, server or routed_server(tokenizer)))
    data = tq.kv_batch_get(keys=keys, partition_id="train")
    out = {name: list(data[name].unbind()) if isinstance(data[name], torch.Tensor) else list(data[name])
           for name in data.keys()}
    out["keys"] = keys
    return out


def test_mixed_episodes_reach_transfer_queue_alike(tokenizer, flaky_environment, tmp_path, caplog):
    cfg = seal_config()
    with caplog.at_level("INFO", logger="verl.utils.tokenizer.continuous_token_wiring"):
        out = play(cfg, TASKS, tokenizer, tmp_path)
    # verl builds a tokenisation builder per episode: its choice is logged once, not 12 times,
    # and names the checkpoint's model type (read from its config.json, not None).
    builder_lines = [r.getMessage() for r in caplog.records if "Continuous Token builder" in r.getMessage()]
    assert len(builder_lines) == len(set(builder_lines)) <= 3
    assert not any("model_type=None" in m for m in builder_lines)

    assert len(out["keys"]) == len(TASKS) * N
    records = out["extra_fields"]
    task_ids = [r["task_id"] for r in records]
    reasons = dict(zip(task_ids, (r["terminated_reason"] for r in records)))
    assert reasons[OVERLONG] == PROMPT_OVERFLOW and reasons[FLOOD] == CONTEXT_OVERFLOW
    assert reasons[LLM_DOWN] == LLM_ERROR and reasons[ABORTED] == LLM_ERROR
    # Every episode kept the sampler's log-probs, aligned with its response; zero off the model's tokens.
    excluded = [bool(r["excluded"]) for r in records]
    for logprobs, mask, skip in zip(out["rollout_log_probs"], out["response_mask"], excluded):
        assert logprobs.shape == mask.shape
        assert bool((logprobs[mask == 1] == -0.5).all()) and (skip or bool((logprobs[mask == 0] == 0).all()))
    assert dict(zip(task_ids, excluded)) == {SOLVED: False, WRONG: False, LLM_DOWN: True, OVERLONG: True,
                                             FLOOD: False, ABORTED: True}
    assert [t for t, r in zip(task_ids, records) if r["env_fault"]] == [SOLVED]
    # Excluded episodes carry no trainable token; the context-overflowed one is trained on.
    masks = {t: m for t, m in zip(task_ids, out["response_mask"])}
    assert int(masks[OVERLONG].sum()) == 0 and int(masks[FLOOD].sum()) > 1000
    # The flooded episode went past response_length (the release's budget is the whole context)
    # and its training tensors were cut to it; the loss mask is the response mask.
    cut = dict(zip(task_ids, (r["truncated_response_tokens"] for r in records)))
    assert cut[FLOOD] > 0 and cut[WRONG] == 0
    assert max(len(r) for r in out["responses"]) == 2048 and max(len(p) for p in out["prompts"]) <= 4096
    assert all(torch.equal(a, b) for a, b in zip(out["loss_mask"], out["response_mask"]))
    # The reward sits on each response's last token (verl's agent-loop output).
    assert [float(s.sum()) for s in out["rm_scores"]] == [float(r["reward"]) for r in records]
    assert all(float(s[-1]) == float(s.sum()) for s in out["rm_scores"])


def test_missing_logprobs_make_an_llm_fault_not_a_ragged_batch(tokenizer, flaky_environment, tmp_path):
    cfg = seal_config()
    server = routed_server(tokenizer)
    for script in server.behaviours.values():
        if script[0] == "flood":
            script[:] = ["nologprobs"]
    out = play(cfg, [WRONG, FLOOD], tokenizer, tmp_path, server)
    assert len(out["rollout_log_probs"]) == 2 * N
    faults = {r["task_id"]: r["llm_fault"] for r in out["extra_fields"]}
    assert faults == {WRONG: False, FLOOD: True}


def test_without_logprobs_requested_no_episode_has_them(tokenizer, flaky_environment, tmp_path):
    cfg = seal_config("actor_rollout_ref.rollout.calculate_log_probs=false")
    out = play(cfg, [WRONG, OVERLONG], tokenizer, tmp_path)
    assert "rollout_log_probs" not in out and len(out["keys"]) == 2 * N


# --------------------------------------------------------------------------- verl's fit()


class _Tracking:
    """verl's metrics tracker: keeps what ``fit`` logs."""

    logged: list[dict] = []

    def __init__(self, *a: Any, **k: Any) -> None:
        pass

    def log(self, data: dict, step: int) -> None:
        self.logged.append(dict(data))


def fit_one_step(cfg: Any, tasks: list[str], tokenizer: Any, tmp_path: Path, monkeypatch: Any) -> Any:
    """verl's V1 ``PPOTrainer.fit`` for one step on ``SealPPOTrainer``: verl's replay buffer and
    step, the stand-in worker groups, verl's agent-loop workers in this process. Returns the
    trainer and the metrics verl logged."""
    from verl.trainer.ppo.metric_utils import RolloutMoELoadBalanceMetricsAccumulator
    from verl.trainer.ppo.v1 import trainer_base

    assert cfg.data.train_batch_size == len(tasks), "verl's replay buffer would wait for more prompts"
    clear_partition()
    trainer = make_trainer(cfg, tmp_path / "run", step=0, steps_per_epoch=1, total_steps=1, rollout_n=None)
    trainer.train_dataloader, trainer.train_dataloader_it = FakeLoader([collate_fn(rows_of(tasks))]), None
    trainer.replay_buffer = trainer._build_replay_buffer()  # verl's sync sampler over TransferQueue
    trainer._rollout_moe_lb_metrics_accumulator = RolloutMoELoadBalanceMetricsAccumulator(
        model_config=trainer.config.actor_rollout_ref.model)
    trainer.resource_pool_manager = type("Pools", (), {"get_n_gpus": lambda self: 1})()
    trainer.local_trigger_step, trainer._restored_tq_prompt_count = 0, 0
    trainer._init_dump_executor()
    monkeypatch.setattr(_Tracking, "logged", [])
    monkeypatch.setattr(trainer_base, "Tracking", _Tracking)
    trainer.fit(rollout_manager(cfg, tokenizer, routed_server(tokenizer)))
    return trainer, _Tracking.logged[-1]


def test_verls_fit_trains_a_mixed_batch_on_the_kept_episodes_only(tokenizer, flaky_environment, tmp_path,
                                                                  monkeypatch):
    trainer, metrics = fit_one_step(seal_config(), TASKS, tokenizer, tmp_path, monkeypatch)

    (sent,) = trainer.actor_rollout_wg.updates  # one actor update, by verl's _update_actor
    loss_rows: dict[str, set[bool]] = {}
    for key in sent.keys:
        task = sent.rows["extra_fields"][key]["task_id"]
        loss_rows.setdefault(task, set()).add(bool(sent.rows["loss_mask"][key].any()))
    # Faults, the overflowed prompt and SOLVED's lone survivor (its sibling's environment failed)
    # are not trained on; the two complete groups are.
    assert loss_rows == {SOLVED: {False}, WRONG: {True}, LLM_DOWN: {False}, OVERLONG: {False}, FLOOD: {True},
                         ABORTED: {False}}
    assert metrics["seal/excluded_episodes"] == 7 and metrics["seal/lone_survivors"] == 1
    assert metrics["seal/trained_episodes"] == 4 and metrics["seal/skipped_updates"] == 0
    assert metrics["actor/pg_loss"] == 0.25 and metrics["seal/truncated_episodes"] == N  # FLOOD's two
    assert any(k.startswith("rollout_corr/") for k in metrics)  # verl's rollout correction ran
    assert trainer.coevolution.state.observe_count == 5  # 12 minus the 7 excluded: the lone survivor counts
    assert trainer.checkpoint_manager.synced[-1] == 1
    assert len(trainer.actor_rollout_wg.log_prob_calls) == 1 and len(trainer.actor_rollout_wg.ref_calls) == 1


def test_verls_fit_skips_a_step_with_nothing_to_train_on(tokenizer, flaky_environment, tmp_path, caplog,
                                                         monkeypatch):
    # Every prompt is longer than data.max_prompt_length: no response token in the whole batch.
    cfg = seal_config("data.max_prompt_length=1024", tasks=2)
    with caplog.at_level("WARNING"):
        trainer, metrics = fit_one_step(cfg, [SOLVED, WRONG], tokenizer, tmp_path, monkeypatch)

    workers = trainer.actor_rollout_wg
    assert workers.updates == [] and workers.log_prob_calls == [] and workers.ref_calls == []
    assert metrics["seal/skipped_updates"] == 1.0 and metrics["seal/excluded_episodes"] == 2 * N
    assert "actor/pg_loss" not in metrics and not any(k.startswith("rollout_corr/") for k in metrics)
    assert any("no episode left to train on" in r.getMessage() for r in caplog.records)
    assert trainer.checkpoint_manager.synced[-1] == 1  # the rollout servers still get the weights
    assert torch.isnan(torch.tensor(metrics["critic/advantages/mean"]))  # verl's metrics of an empty batch


def test_verls_fit_reads_the_step_once(tokenizer, flaky_environment, tmp_path, monkeypatch):
    """The step rules run once and each record is read once per step, although four SEAL seams
    (the balance, old and reference log-probs, the actor update) use them; verl's advantages run
    the SEAL estimator once."""
    from verl.trainer.ppo import core_algos

    from seal.advantage.grpo import SEAL_GRPO
    from seal.trainer.verl import batch as seal_batch
    from seal.trainer.verl import trainer as seal_trainer

    calls = {"read_step": 0, "select_trainable": 0, "record_of": 0, SEAL_GRPO: 0}

    def counted(name: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(seal_trainer, "read_step", counted("read_step", seal_trainer.read_step))
    for name in ("select_trainable", "record_of"):
        monkeypatch.setattr(seal_batch, name, counted(name, getattr(seal_batch, name)))
    monkeypatch.setitem(core_algos.ADV_ESTIMATOR_REGISTRY, SEAL_GRPO,
                        counted(SEAL_GRPO, core_algos.ADV_ESTIMATOR_REGISTRY[SEAL_GRPO]))
    trainer, metrics = fit_one_step(seal_config(), TASKS, tokenizer, tmp_path, monkeypatch)

    assert calls == {"read_step": 1, "select_trainable": 1, "record_of": len(TASKS) * N, SEAL_GRPO: 1}
    assert trainer.config.algorithm.adv_estimator == SEAL_GRPO
    assert metrics["seal/excluded_episodes"] == 7 and metrics["seal/lone_survivors"] == 1
