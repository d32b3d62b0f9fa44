"""verl's own actor worker in this process, for the update tests: a tiny random Llama saved to
disk (the worker loads its model from a path), the recipe as the verl backend hands it to the
workers on a CPU, and a step's episodes in TransferQueue as verl's V1 trainer holds them.

The worker is verl 0.9.1's ``ActorRolloutRefWorker`` (``TrainingWorker`` -> the FSDP engine ->
``verl.workers.utils.losses.ppo_loss``), run on the project's CPU platform inside the
``cpu_verl`` fixture (:func:`seal.trainer.verl.cpu.in_process`). verl's V1 trainer hands its
methods a ``KVBatchMeta``: the worker's registered methods (``compute_log_prob``,
``update_actor``) go through verl's TransferQueue bridge (``tqbridge``), which reads the rows from
TransferQueue, runs the method on them and writes its per-row outputs back, in this process as in
a Ray worker (the ``transfer_queue`` fixture).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

VOCAB = 128


def save_tiny_llama(path: Path, *, perturb: float = 0.0, perturb_seed: int = 1) -> Path:
    """Save a 2-layer, hidden-32 Llama over ``VOCAB`` tokens, random weights from seed 0.

    ``perturb``: the std of seeded Gaussian noise added to every weight, e.g. a policy some
    steps away from a reference saved with ``perturb=0``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0)
    model = LlamaForCausalLM(config)
    if perturb:
        g = torch.Generator().manual_seed(perturb_seed)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(perturb * torch.randn(p.shape, generator=g))
    model.save_pretrained(path)
    return path


def load_tiny_llama(path: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")


def model_overrides(model_dir: Path) -> list[str]:
    """The config overrides that put the tiny model on the actor: token ids in, so no tokenizer;
    no gradient checkpointing (the recipe's), which the tiny model does not need."""
    return [f"actor_rollout_ref.model.path={model_dir}",
            "+actor_rollout_ref.model.load_tokenizer=false",
            "actor_rollout_ref.model.enable_gradient_checkpointing=false"]


def worker_config(cfg: DictConfig, root: Path) -> DictConfig:
    """``cfg`` as the verl backend hands it to its workers on a machine without an accelerator
    or flash-attn: :func:`prepare_config` (sdpa, no padding removal), then :func:`adapt_to_cpu`
    (FSDP2, fp32 parameters and reductions, no torch.compile)."""
    from seal.trainer.verl.cpu import adapt_to_cpu
    from seal.trainer.verl.main import prepare_config

    prepared = prepare_config(cfg, exp_dir=root / "exp", base=root, flash_attn=False)
    adapt_to_cpu(prepared)
    return prepared


def actor_worker(config: DictConfig, wrap_loss: Callable[[Callable], Callable] | None = None,
                 role: str = "actor") -> Any:
    """verl's ``ActorRolloutRefWorker`` (``role``) on ``config``, model and optimizer built;
    ``wrap_loss(ppo_loss_with_its_config)`` replaces its loss function when given. As a worker
    group it has one data-parallel rank (what verl's ``_balance_batch`` asks a group)."""
    from verl.workers.engine_workers import ActorRolloutRefWorker

    worker = ActorRolloutRefWorker(config=config.actor_rollout_ref, role=role)
    worker.init_model()
    if wrap_loss is not None:
        worker.set_loss_fn(wrap_loss(worker.loss_fn))
    worker._dispatch_info = {"actor": [0]}
    return worker


def put_group(prompt: Sequence[int], responses: Sequence[Sequence[int]], masks: Sequence[Sequence[int]],
              records: Sequence[dict[str, Any]], *, step: int = 1, task: str = "multi_turn_base_3") -> Any:
    """One GRPO group of episodes (one prompt, its responses, their loss masks and SEAL records)
    in TransferQueue, put by verl's agent-loop post-processing (:func:`verl_testkit.put_outputs`);
    returns the ``KVBatchMeta``. The reward is each record's, on its last response token; the
    sampler's log-probs (the recipe's ``rollout.calculate_log_probs``) are placeholders, -0.5 on
    the model's tokens and 0 elsewhere, as the agent loop records them: verl reads them for its
    rollout-correction and debug metrics only (no importance weights in the recipe)."""
    import uuid

    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput
    from verl_testkit import agent_extra_fields, put_outputs

    uid = uuid.uuid4().hex
    episodes = [(AgentLoopOutput(prompt_ids=list(prompt), response_ids=list(r), response_mask=list(m),
                                 response_logprobs=[-0.5 if x else 0.0 for x in m],
                                 reward_score=float(rec["reward"]), num_turns=4, metrics=AgentLoopMetrics(),
                                 extra_fields=agent_extra_fields(rec, step)),
                 {"uid": uid, "task_id": task, "index": task, "data_source": task.rsplit("_", 1)[0],
                  "rollout_mode": "sample"})
                for r, m, rec in zip(responses, masks, records)]
    return put_outputs(episodes, step=step)


def put_fields(batch: Any, **fields: Sequence[torch.Tensor]) -> None:
    """Write per-row tensors (one 1-D tensor per key of ``batch``, in its order) to TransferQueue."""
    import transfer_queue as tq
    from tensordict import TensorDict

    nested = {k: torch.nested.as_nested_tensor([t.clone() for t in v], layout=torch.jagged) for k, v in fields.items()}
    tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=TensorDict(nested, batch_size=len(batch)))


def verl_logprobs(trainer: Any, batch: Any) -> list[torch.Tensor]:
    """Each row's response log-probs from verl's own V1 log-prob pass
    (``PPOTrainer._compute_old_log_prob``: the worker through its TransferQueue bridge; SEAL's
    override only skips it when no episode is left to train on), in ``batch``'s key order."""
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer
    from verl_testkit import read_rows

    PPOTrainer._compute_old_log_prob(trainer, batch, {})
    return read_rows(batch.keys, "old_log_probs", partition=batch.partition_id)["old_log_probs"]


def hf_response_logprobs(model: torch.nn.Module, prompts: Sequence[Sequence[int]],
                         responses: Sequence[Sequence[int]]) -> list[torch.Tensor]:
    """Each response's ``(R,)`` log-probs from a plain transformers forward (the local
    backend's function)."""
    from seal.trainer.local.policy import response_logprobs

    with torch.no_grad():
        return [response_logprobs(model, list(p), list(r), torch.device("cpu")) for p, r in zip(prompts, responses)]
