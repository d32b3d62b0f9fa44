"""The warm start's supervised fine-tune on one device (local backend: CPU or one GPU).

Loss: the mean negative log-likelihood of the model-written response tokens (mask 1), averaged
over every such token of an optimizer step's ``batch_size`` transcripts (token-mean, as verl's SFT
trainer does), the closing lines weighted ``closing_weight`` (a weighted mean); observations and
the prompt are context only. AdamW at a constant learning rate,
gradient-norm clipping, a seeded shuffle per epoch. The GPU path runs verl's own SFT trainer on
the same conversations instead (:mod:`seal.warm_start.verl_sft`).
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from tqdm import tqdm

from seal.trainer.local.policy import autocast_context
from seal.trainer.local.prefix import Row, row_logprobs
from seal.warm_start.settings import WarmStartSettings
from seal.warm_start.transcripts import Transcript

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SftReport:
    """Per-epoch mean token NLL, optimizer steps and wall time of one fine-tune."""

    epoch_losses: tuple[float, ...]
    steps: int
    trained_tokens: int
    seconds: float


def transcript_nll(model: torch.nn.Module, t: Transcript, device: torch.device, closing_weight: float = 1.0
                   ) -> torch.Tensor:
    """Weighted NLL of ``t``'s model-written tokens, summed (a scalar with a graph); closing lines
    weigh ``closing_weight``. The LM head runs only at those tokens: the observations inside the
    response, most of its length, get no logits."""
    logp = row_logprobs(model, Row.of(t.prompt_ids, t.response_ids, t.response_mask), (), device)
    weights = torch.tensor(t.token_weights(closing_weight), dtype=logp.dtype, device=logp.device)
    return -(logp * weights).sum()


def supervised_finetune(model: torch.nn.Module, transcripts: Sequence[Transcript], settings: WarmStartSettings, *,
                        device: torch.device, autocast: str, progress: bool = True) -> SftReport:
    """Fine-tune ``model`` in place on ``transcripts``; returns the per-epoch losses."""
    if not transcripts:
        raise ValueError("supervised_finetune needs at least one transcript")
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=0.0)
    rng = random.Random(settings.seed)
    torch.manual_seed(settings.seed)
    model.train()
    t0, steps, losses = time.time(), 0, []
    order = list(range(len(transcripts)))
    total_steps = settings.epochs * math.ceil(len(order) / settings.batch_size)
    bar = tqdm(total=total_steps, desc="warm start (SFT)", disable=not progress)
    for epoch in range(settings.epochs):
        rng.shuffle(order)
        nll_sum, tok_sum = 0.0, 0
        for start in range(0, len(order), settings.batch_size):
            batch = [transcripts[i] for i in order[start:start + settings.batch_size]]
            ntok = max(sum(sum(t.token_weights(settings.closing_weight)) for t in batch), 1e-6)
            optimizer.zero_grad(set_to_none=True)
            for t in batch:
                with autocast_context(device, autocast):
                    nll = transcript_nll(model, t, device, settings.closing_weight).float()
                (nll / ntok).backward()
                nll_sum += float(nll.detach())
            tok_sum += ntok
            grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip))
            if math.isfinite(grad_norm):
                optimizer.step()
            else:
                logger.warning("warm start: non-finite gradient norm at step %d; step skipped", steps + 1)
            steps += 1
            bar.update(1)
            bar.set_postfix(loss=f"{nll_sum / max(tok_sum, 1):.3f}")
        losses.append(nll_sum / max(tok_sum, 1))
        logger.info("warm start epoch %d/%d: mean token NLL %.4f", epoch + 1, settings.epochs, losses[-1])
    bar.close()
    model.eval()
    return SftReport(tuple(losses), steps, sum(t.trained_tokens for t in transcripts) * settings.epochs,
                     time.time() - t0)
