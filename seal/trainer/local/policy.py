"""The policy on one device: loading, per-token log-probs, and verl's GRPO/PPO loss.

Weights stay fp32 (master weights): with bf16 weights an update at lr 1e-6 rounds away. The
forward passes run under bf16 autocast when ``seal.local.autocast`` resolves to bf16 (``auto``:
only where the device runs bf16 natively, :mod:`seal.engine.precision`).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from seal.config_base import ConfigError, check_hub_model, looks_local, resolve_path
from seal.engine.precision import resolve_autocast

# KL estimators (verl's kl_penalty names) whose gradient vanishes where the policy equals the
# reference: k2/mse, k3/low_var_kl, abs (torch's subgradient at 0 is 0) and every straight-through
# "+" form (its backward is k2's). k1 ("kl") has gradient 1 per token there, so it never does.
KL_ZERO_GRAD_AT_REFERENCE = frozenset({"low_var_kl", "k3", "mse", "k2", "abs"})


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"seal.local.device={name}: no CUDA device here; use cpu or auto")
    return torch.device(name)


def autocast_context(device: torch.device, mode: str) -> contextlib.AbstractContextManager:
    """bf16/fp16 autocast on ``device`` (``none``: full precision; ``auto``: resolved for ``device``)."""
    dtype = resolve_autocast(mode, device).dtype
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def model_path(cfg: DictConfig) -> str:
    """``actor_rollout_ref.model.path``; a relative path is tried against the project root too."""
    return str(resolve_path(str(cfg.actor_rollout_ref.model.path)))


def load_policy(cfg: DictConfig, device: torch.device) -> tuple[Any, Any]:
    """``(model, tokenizer)`` in fp32 on ``device``, offline-friendly (local paths)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = model_path(cfg)
    if not looks_local(path):
        check_hub_model("actor_rollout_ref.model.path", path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    except OSError as exc:
        raise ConfigError(f"actor_rollout_ref.model.path={path}: cannot load the model ({exc}); "
                          "run install.sh or point the key at a local model folder") from exc
    return model.to(device), tokenizer


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    """The reference policy for the KL term: a frozen copy of the initial weights."""
    ref = copy.deepcopy(model)
    ref.eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


def same_weights(model: torch.nn.Module, other: torch.nn.Module) -> bool:
    """Whether two modules hold bit-identical parameters (one pass over the weights, stopping at
    the first difference): the exact test of "the policy still equals the reference"."""
    theirs = dict(other.named_parameters())
    for name, p in model.named_parameters():
        q = theirs.get(name)
        if q is None or q.shape != p.shape or not torch.equal(p.detach(), q.detach().to(p.device)):
            return False
    return len(theirs) == len(dict(model.named_parameters()))


def response_logprobs(model: torch.nn.Module, prompt_ids: Sequence[int], response_ids: Sequence[int],
                      device: torch.device) -> torch.Tensor:
    """Log-probability of each response token given everything before it.

    One unpadded sequence; only the last ``R + 1`` positions go through the LM head, so the
    ``(R, vocab)`` logits are the only large activation. Returns ``(R,)`` float32.
    """
    ids = torch.tensor([list(prompt_ids) + list(response_ids)], dtype=torch.long, device=device)
    r = len(response_ids)
    logits = model(input_ids=ids, logits_to_keep=r + 1, use_cache=False).logits[0, :-1].float()
    targets = ids[0, -r:]
    return torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


@dataclass
class LossSettings:
    """The actor's loss knobs (verl's ``actor_rollout_ref.actor`` keys)."""

    clip_ratio: float
    clip_ratio_low: float | None
    clip_ratio_high: float | None
    clip_ratio_c: float
    loss_agg_mode: str
    use_kl_loss: bool
    kl_loss_coef: float
    kl_loss_type: str
    # The local loss has no entropy term (from_cfg refuses one); the field exists so the
    # zero-advantage rule below stays right should one be added.
    entropy_coeff: float = 0.0

    @property
    def kl_grad_vanishes_at_reference(self) -> bool:
        """Whether the KL term's gradient is exactly 0 while the policy equals the reference."""
        return self.kl_loss_type.endswith("+") or self.kl_loss_type in KL_ZERO_GRAD_AT_REFERENCE

    @classmethod
    def from_cfg(cls, actor: DictConfig) -> LossSettings:
        """The loss knobs of a checked config (the config pass holds the local trainer to no
        entropy term and verl's vanilla PPO clip: :data:`seal.config_values.LOCAL_RULES`)."""
        return cls(
            clip_ratio=float(actor.clip_ratio),
            clip_ratio_low=actor.get("clip_ratio_low"),
            clip_ratio_high=actor.get("clip_ratio_high"),
            clip_ratio_c=float(actor.get("clip_ratio_c", 3.0)),
            loss_agg_mode=str(actor.loss_agg_mode),
            use_kl_loss=bool(actor.use_kl_loss),
            kl_loss_coef=float(actor.kl_loss_coef),
            kl_loss_type=str(actor.kl_loss_type),
        )

    def verl_config(self, batch_num_tokens: int, global_batch_size: int) -> DictConfig:
        """The minimal actor config verl's policy loss reads (clip ratios and batch info)."""
        return OmegaConf.create({
            "clip_ratio": self.clip_ratio,
            "clip_ratio_low": self.clip_ratio_low,
            "clip_ratio_high": self.clip_ratio_high,
            "clip_ratio_c": self.clip_ratio_c,
            "global_batch_info": {"dp_size": 1, "batch_num_tokens": batch_num_tokens,
                                  "global_batch_size": global_batch_size},
        })


def sequence_loss(logp: torch.Tensor, old_logp: torch.Tensor, ref_logp: torch.Tensor | None, advantages: torch.Tensor,
                  mask: torch.Tensor, settings: LossSettings, *, batch_num_tokens: int,
                  global_batch_size: int) -> tuple[torch.Tensor, dict[str, float]]:
    """verl's PPO-clip policy loss (+ ``low_var_kl`` to the reference) for one sequence.

    All tensors are ``(1, R)``. The aggregation divides by the whole mini-batch's token count
    (``batch_num_tokens``), so summing the per-sequence losses gives the mini-batch token-mean.
    """
    from verl.trainer.ppo import core_algos

    vcfg = settings.verl_config(batch_num_tokens, global_batch_size)
    policy_loss = core_algos.get_policy_loss_fn("vanilla")
    pg_loss, pg_metrics = policy_loss(old_logp, logp, advantages, mask, settings.loss_agg_mode, vcfg)
    metrics = {k: float(v) for k, v in pg_metrics.items()}
    metrics["actor/pg_loss"] = float(pg_loss.detach())
    loss = pg_loss
    if settings.use_kl_loss and ref_logp is not None:
        kl = core_algos.kl_penalty(logp, ref_logp, settings.kl_loss_type)
        kl_loss = core_algos.agg_loss(kl, mask, settings.loss_agg_mode, **vcfg.global_batch_info)
        loss = loss + settings.kl_loss_coef * kl_loss
        metrics["actor/kl_loss"] = float(kl_loss.detach())
    return loss, metrics
