"""verl's rollout path on CPU, end to end, with the project's pieces plugged in where verl plugs them.

Dataset rows -> verl's collate -> ``SealRayPPOTrainer._get_gen_batch`` -> the agent loop verl
resolves from ``agent_loops.yaml`` and instantiates as its worker does -> ``run`` against the real
environment (in-process) and a scripted token server -> verl's own per-sample post-processing and
batch assembly -> ``compute_advantage`` -> the SEAL hook. Only the LLM (scripted) and the FSDP
actor update (recorded) are stand-ins.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from verl_testkit import make_trainer
from omegaconf import OmegaConf

from seal.config import REPO_ROOT, compose_config

pytest.importorskip("verl")

from verl import DataProto  # noqa: E402
from verl.experimental.agent_loop.agent_loop import (  # noqa: E402
    AgentLoopWorker, DictConfigWrap, ToolListWrap, _agent_loop_registry,
)
from verl.trainer.ppo.ray_trainer import compute_advantage  # noqa: E402
from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn  # noqa: E402

from seal.trainer.verl.dataset import TaskDataset  # noqa: E402
from seal.trainer.verl.main import AGENT_LOOPS_YAML  # noqa: E402

MODEL_DIR = REPO_ROOT / "models" / "SmolLM2-135M-Instruct"
# multi_turn_base_100 (TradingBot): turn 1 get_stock_info(symbol='NVDA'); turn 2 fund_account(amount=2203.4).
TASK = "multi_turn_base_100"
CALL_STOCK = '<tool_call>\n{"name": "get_stock_info", "arguments": {"symbol": "NVDA"}}\n</tool_call>'
CALL_FUND = '<tool_call>\n{"name": "fund_account", "arguments": {"amount": 2203.4}}\n</tool_call>'
# Rollout 0 solves the task; rollout 1 answers in prose and fails both turns.
SCRIPT = [CALL_STOCK, "NVDA trades at its listed price.", CALL_FUND, "Done.", "I cannot help.", "Still no."]


class Server:
    """A token-level ``server_manager``: the next scripted completion, then EOS."""

    def __init__(self, tokenizer: Any, eos: int) -> None:
        self.tokenizer, self.eos, self.script = tokenizer, eos, list(SCRIPT)

    async def generate(self, request_id: str, prompt_ids: list[int], sampling_params: dict, **kw: Any) -> Any:
        from verl.workers.rollout.replica import TokenOutput

        ids = self.tokenizer.encode(self.script.pop(0), add_special_tokens=False) + [self.eos]
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids), stop_reason="completed")


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    if not (MODEL_DIR / "tokenizer.json").is_file():
        pytest.skip("models/SmolLM2-135M-Instruct is missing; run install.sh")
    from verl.utils.tokenizer.tokenizer import hf_tokenizer

    return hf_tokenizer(str(MODEL_DIR))  # as verl's HFModelConfig loads it (pad token set)


def _worker(cfg: Any, tokenizer: Any) -> AgentLoopWorker:
    """verl's AgentLoopWorker for its post-processing methods (no Ray, no model)."""
    worker = object.__new__(AgentLoopWorker)
    rollout = cfg.actor_rollout_ref.rollout
    worker.rollout_config = SimpleNamespace(prompt_length=int(rollout.prompt_length),
                                            response_length=int(rollout.response_length))
    worker.tokenizer, worker.processor, worker.mm_processor_kwargs = tokenizer, None, {}
    worker.distillation_enabled = False
    worker.reward_loop_worker_handles = ["reward-loop"]  # verl's default: a reward loop exists
    return worker


async def _rollout(cfg: Any, gen: DataProto, tokenizer: Any) -> DataProto:
    # What AgentLoopWorker.__init__ does with agent_loop_config_path, then _run_agent_loop.
    for entry in OmegaConf.load(AGENT_LOOPS_YAML):
        _agent_loop_registry[entry.name] = entry
    worker = _worker(cfg, tokenizer)
    server = Server(tokenizer, tokenizer.convert_tokens_to_ids("<|im_end|>"))
    outputs = []
    for i in range(len(gen)):
        kwargs = {k: v[i] for k, v in gen.non_tensor_batch.items()}
        import hydra

        loop = hydra.utils.instantiate(
            config=_agent_loop_registry[kwargs.pop("agent_name")], trainer_config=DictConfigWrap(config=cfg),
            server_manager=server, tokenizer=tokenizer, processor=None, hf_model_type=None,
            dataset_cls=RLHFDataset, data_config=DictConfigWrap(cfg.data), tools=ToolListWrap([]))
        out = await loop.run({"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}, **kwargs)
        outputs.append(await worker._agent_loop_postprocess(out, False, **kwargs))
    return worker._postprocess(outputs, input_non_tensor_batch=gen.non_tensor_batch, validate=False)


class ActorGroup:
    """Stands in for the FSDP actor worker group: records the TensorDict verl would send."""

    def update_actor(self, batch_td: Any) -> Any:
        from verl.utils import tensordict_utils as tu

        self.sent = batch_td
        return tu.get_tensordict(tensor_dict={}, non_tensor_dict={"metrics": {"pg_loss": 0.5, "mfu": 0.0}})


def test_one_step_through_verls_rollout_path(tokenizer, tmp_path):
    cfg = compose_config("exp/SEAL.yaml", ["env_service.url=null", "actor_rollout_ref.rollout.n=2"])
    dataset = TaskDataset([TASK], rollout_mode="sample",
                              agent_name=str(cfg.actor_rollout_ref.rollout.agent.default_agent_loop))
    batch = DataProto.from_single_dict(collate_fn([dataset[0]]))
    batch.non_tensor_batch["uid"] = np.array(["uid-0"], dtype=object)
    trainer = make_trainer(cfg, tmp_path, step=1)

    gen = trainer._get_gen_batch(batch)  # fit(): pop the generation fields, add env_params
    assert gen.non_tensor_batch["env_params"][0]["rollout_mode"] == "sample"
    assert gen.non_tensor_batch["env_params"][0]["observation_lite"]["enable"] is True
    gen = gen.repeat(repeat_times=2, interleave=True)
    out = asyncio.run(_rollout(cfg, gen, tokenizer))

    batch = batch.repeat(repeat_times=2, interleave=True).union(out)  # fit(): join rows and outputs
    assert list(batch.non_tensor_batch["task_id"]) == [TASK, TASK]
    batch.batch["token_level_scores"] = batch.batch["rm_scores"]
    batch.batch["token_level_rewards"] = batch.batch["rm_scores"]
    assert batch.batch["token_level_scores"].sum(-1).tolist() == [1.0, 0.0]
    batch = compute_advantage(batch, adv_estimator="grpo", num_repeat=2)

    # verl's own _update_actor runs (DataProto -> TensorDict -> no-padding layout, with every
    # SEAL column attached); only the Ray call into the FSDP workers is a stand-in.
    trainer.distillation_config = None
    trainer.actor_rollout_wg = ActorGroup()
    metrics = trainer._update_actor(batch).meta_info["metrics"]
    sent = trainer.actor_rollout_wg.sent
    assert torch.equal(sent["advantages"], batch.batch["advantages"])  # the A-Patch-scaled advantages
    assert {"task_id", "check", "env_fault", "input_ids", "loss_mask"} <= set(sent.keys())
    assert metrics["actor/pg_loss"] == 0.5 and "perf/mfu/actor" in metrics
    assert metrics["seal/observed_episodes"] == 2 and metrics["seal/success_rate"] == 0.5
    task = trainer.coevolution.state.tasks[TASK]
    assert task["count"] == 2 and task["success"] == 1
    assert trainer.coevolution.state.total["tags"]["empty_turn_model_response"].count >= 1
    # The update sees model tokens only: the response mask is a strict subset of the response.
    mask, attn = batch.batch["response_mask"], batch.batch["attention_mask"][:, -batch.batch["responses"].shape[1]:]
    assert 0 < int(mask[0].sum()) < int(attn[0].sum())


def test_agent_loops_yaml_names_the_registered_loop():
    import hydra

    from seal.rollout.agent_loop import AGENT_NAME, LEGACY_AGENT_NAME, SealAgentLoop

    entry, alias = OmegaConf.load(AGENT_LOOPS_YAML)
    default = compose_config("exp/SEAL.yaml").actor_rollout_ref.rollout.agent.default_agent_loop
    assert entry.name == AGENT_NAME == default and alias.name == LEGACY_AGENT_NAME
    for e in (entry, alias):  # the same class as @register in the module, under both names
        assert e._target_ == _agent_loop_registry[e.name]["_target_"]
        assert hydra.utils.get_class(e._target_) is SealAgentLoop
    assert Path(AGENT_LOOPS_YAML).parent == Path(__file__).resolve().parents[4] / "seal" / "trainer" / "verl"
