"""verl's V1 rollout path on CPU, end to end, with the project's pieces plugged in where verl plugs them.

Dataset rows -> verl's collate and ``_next_train_batch`` -> ``_submit_batch_to_rollout`` through
SEAL's :class:`EpisodeParamsDispatch` (env params, epoch) -> verl's ``AgentLoopManagerTQ`` /
``AgentLoopWorkerTQ`` (``rollout.n`` sessions, the agent loop resolved from ``agent_loops.yaml``)
-> ``run`` against the real environment (in-process) and a scripted token server -> verl's own
post-processing into TransferQueue -> verl's replay buffer and ``_step_once`` (the step rules,
log-probs, advantages, the SEAL step, the actor update). Only the LLM (scripted) and the FSDP
worker groups (recorded) are stand-ins.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf
from verl_fakes import RoutedServer, dispatch, rollout_manager
from verl_testkit import clear_partition, make_trainer, read_rows

from seal.config import REPO_ROOT, compose_config

pytest.importorskip("verl")

from verl.experimental.agent_loop.agent_loop import _agent_loop_registry  # noqa: E402

from seal.rollout.agent_loop import request_seed  # noqa: E402
from seal.trainer.verl.dataset import TaskDataset  # noqa: E402
from seal.trainer.verl.main import AGENT_LOOPS_YAML  # noqa: E402

MODEL_DIR = REPO_ROOT / "models" / "SmolLM2-135M-Instruct"
# multi_turn_base_100 (TradingBot): turn 1 get_stock_info(symbol='NVDA'); turn 2 fund_account(amount=2203.4).
TASK = "multi_turn_base_100"
CALL_STOCK = '<tool_call>\n{"name": "get_stock_info", "arguments": {"symbol": "NVDA"}}\n</tool_call>'
CALL_FUND = '<tool_call>\n{"name": "fund_account", "arguments": {"amount": 2203.4}}\n</tool_call>'
# Session 0 solves the task; session 1 answers in prose and fails both turns.
SCRIPTS = {0: [CALL_STOCK, "NVDA trades at its listed price.", CALL_FUND, "Done."], 1: ["I cannot help.", "Still no."]}


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    if not (MODEL_DIR / "tokenizer.json").is_file():
        pytest.skip("models/SmolLM2-135M-Instruct is missing; run install.sh")
    from verl.utils.tokenizer.tokenizer import hf_tokenizer

    return hf_tokenizer(str(MODEL_DIR))  # as verl's HFModelConfig loads it (pad token set)


def session_server(cfg: Any, tokenizer: Any, step: int) -> RoutedServer:
    """Each request is answered by its episode's script, found by its sampling seed: the agent
    loop seeds every call from (rollout seed, step, task, session, call number)."""
    base = int(cfg.actor_rollout_ref.rollout.seed)
    by_seed = {request_seed(f"{base}:{step}:{TASK}:{session}:{call}"): text
               for session, script in SCRIPTS.items() for call, text in enumerate(script)}
    return RoutedServer(tokenizer, tokenizer.convert_tokens_to_ids("<|im_end|>"), {}, by_seed=by_seed)


class SpyManager:
    """verl's manager, seeing the rows it is dispatched."""

    def __init__(self, manager: Any) -> None:
        self.manager, self.rows = manager, []

    def generate_sequences(self, batch: Any) -> None:
        self.rows.append({k: list(batch[k]) for k in ("env_params", "extra_info", "task_id")})
        return self.manager.generate_sequences(batch)


@pytest.mark.usefixtures("transfer_queue")
def test_one_step_through_verls_rollout_path(tokenizer, tmp_path):
    cfg = compose_config("exp/SEAL.yaml", [
        "env_service.url=null", "actor_rollout_ref.rollout.n=2", "data.train_batch_size=1",
        "actor_rollout_ref.actor.ppo_mini_batch_size=1", "trainer.n_gpus_per_node=1"])
    dataset = TaskDataset([TASK], rollout_mode="sample",
                          agent_name=str(cfg.actor_rollout_ref.rollout.agent.default_agent_loop))
    clear_partition()
    trainer = make_trainer(cfg, tmp_path, step=1, rollout_n=None)
    server = session_server(cfg, tokenizer, step=1)
    spy = SpyManager(rollout_manager(cfg, tokenizer, server, num_workers=1))

    keys = dispatch(trainer, [dataset[0]], spy)  # fit(): the step's prompts, with env params
    (rows,) = spy.rows
    assert rows["task_id"] == [TASK] and rows["env_params"][0]["rollout_mode"] == "sample"
    assert rows["env_params"][0]["observation_lite"]["enable"] is True and rows["extra_info"][0]["epoch"] == 0
    assert len(keys) == 2 and server.calls == 6 and set(server.seeds) <= set(server.by_seed)

    trainer.replay_buffer = trainer._build_replay_buffer()  # verl's sync sampler over TransferQueue
    metrics: dict = {}
    batch = trainer._step_once(metrics, {}, 1)
    assert sorted(batch.keys) == keys
    data = read_rows(keys, "rm_scores", "response_mask", "responses", "extra_fields", "env_params", "task_id")
    assert [float(s.sum()) for s in data["rm_scores"]] == [1.0, 0.0]  # sessions 0 and 1
    assert data["task_id"] == [TASK, TASK] and data["env_params"][0]["rollout_mode"] == "sample"
    # verl's own _update_actor sent the step to the workers with the A-Patch-scaled advantages.
    (update,) = trainer.actor_rollout_wg.updates
    advantages = [update.rows["advantages"][k] for k in keys]
    assert bool((advantages[0][data["response_mask"][0] == 1] > 0).all()) and bool((advantages[1] < 0).any())
    assert metrics["actor/pg_loss"] == 0.25 and "perf/mfu/actor" in metrics
    assert metrics["seal/observed_episodes"] == 2 and metrics["seal/success_rate"] == 0.5
    assert metrics["seal/apatch/scaled_count"] == 2
    task = trainer.coevolution.state.tasks[TASK]
    assert task["count"] == 2 and task["success"] == 1
    assert trainer.coevolution.state.total["tags"]["empty_turn_model_response"].count >= 1
    # The update sees model tokens only: the response mask is a strict subset of the response.
    assert 0 < int(data["response_mask"][0].sum()) < len(data["responses"][0])


def test_agent_loops_yaml_names_the_registered_loop():
    import hydra

    from seal.rollout.agent_loop import AGENT_NAME, SealAgentLoop

    (entry,) = OmegaConf.load(AGENT_LOOPS_YAML)
    default = compose_config("exp/SEAL.yaml").actor_rollout_ref.rollout.agent.default_agent_loop
    assert entry.name == AGENT_NAME == default
    # The same class as @register in the module.
    assert entry._target_ == _agent_loop_registry[entry.name]["_target_"]
    assert hydra.utils.get_class(entry._target_) is SealAgentLoop
    assert Path(AGENT_LOOPS_YAML).parent == Path(__file__).resolve().parents[4] / "seal" / "trainer" / "verl"
