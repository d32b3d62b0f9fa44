"""verl's own actor worker in this process, for the update tests: a tiny random Llama saved to
disk (the worker loads its model from a path), the recipe as the verl backend hands it to the
workers on a CPU, and ``fit()``-shaped batches built from episodes.

The worker is verl 0.9.1's ``ActorRolloutRefWorker`` (``TrainingWorker`` -> the FSDP engine ->
``verl.workers.utils.losses.ppo_loss``), run on the project's CPU platform inside the
``cpu_verl`` fixture (:func:`seal.trainer.verl.cpu.in_process`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
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


def actor_worker(config: DictConfig, wrap_loss: Callable[[Callable], Callable] | None = None) -> Any:
    """verl's ``ActorRolloutRefWorker`` (role ``actor``) on ``config``, model and optimizer
    built; ``wrap_loss(ppo_loss_with_its_config)`` replaces its loss function when given."""
    from verl.workers.engine_workers import ActorRolloutRefWorker

    worker = ActorRolloutRefWorker(config=config.actor_rollout_ref, role="actor")
    worker.init_model()
    if wrap_loss is not None:
        worker.set_loss_fn(wrap_loss(worker.loss_fn))
    return worker


def object_column(values: Sequence[Any]) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = list(values)
    return out


def padded_batch(prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]],
                 masks: Sequence[Sequence[int]], *, prompt_pad: int = 2, response_pad: int = 3
                 ) -> dict[str, torch.Tensor]:
    """The token tensors of a batch as verl's agent loop hands them to ``fit()``: prompts
    left-padded, responses right-padded (``prompt_pad`` / ``response_pad`` past the longest),
    the attention mask and position ids over both, and the loss mask (0 on padding)."""
    width_p = max(map(len, prompts)) + prompt_pad
    width_r = max(map(len, responses)) + response_pad
    b = len(prompts)
    out = {name: torch.zeros(b, width, dtype=torch.long) for name, width in
           (("prompts", width_p), ("prompt_attention", width_p), ("responses", width_r),
            ("response_attention", width_r), ("response_mask", width_r))}
    for i, (p, r, m) in enumerate(zip(prompts, responses, masks)):
        out["prompts"][i, width_p - len(p):] = torch.tensor(p)
        out["prompt_attention"][i, width_p - len(p):] = 1
        out["responses"][i, : len(r)] = torch.tensor(r)
        out["response_attention"][i, : len(r)] = 1
        out["response_mask"][i, : len(m)] = torch.tensor(m)
    attention_mask = torch.cat([out.pop("prompt_attention"), out.pop("response_attention")], dim=1)
    out.update(input_ids=torch.cat([out["prompts"], out["responses"]], dim=1), attention_mask=attention_mask,
               position_ids=(attention_mask.cumsum(dim=1) - 1).clamp(min=0))
    return out


def hf_response_logprobs(model: torch.nn.Module, prompts: Sequence[Sequence[int]],
                         responses: Sequence[Sequence[int]]) -> list[torch.Tensor]:
    """Each response's ``(R,)`` log-probs from a plain transformers forward (the local
    backend's function)."""
    from seal.trainer.local.policy import response_logprobs

    with torch.no_grad():
        return [response_logprobs(model, list(p), list(r), torch.device("cpu")) for p, r in zip(prompts, responses)]
