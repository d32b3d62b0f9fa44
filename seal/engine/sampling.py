"""How the engines pick a token: greedy, or temperature / top-k / top-p sampling by inverse CDF.

Every sampled token is one float64 uniform ``u`` from its row's stream, turned into a token by
:func:`hinted_draw`: the inverse CDF of the target distribution ``p`` with one token, the row's
*hint*, ordered first. The hint is the token prompt lookup predicts (:mod:`seal.engine.ngram`);
``-1`` means none (then it is the plain inverse CDF). Putting one token first changes which ``u``
maps to which token, never the distribution: token ``h`` is drawn iff ``u < p(h)``, any other
token ``x`` with probability ``p(x)``.

The order is what makes speculative decoding (:mod:`seal.engine.speculative`) draw *the same
tokens* as plain decoding: with a deterministic draft ``d`` (the hint), standard speculative
sampling accepts ``d`` with probability ``p(d)`` and otherwise samples from ``p`` with ``d``
removed and renormalised, and :func:`hinted_draw` is exactly that with the acceptance test and
the resample sharing one uniform (``u < p(d)``: accept; else ``(u - p(d)) / (1 - p(d))`` is uniform
on [0, 1) and picks from the rest). So a row's ``t``-th sampled token is a function of its ``t``-th
uniform, its logits and its own text alone, whether it was drafted, by how many tokens, or not
speculated at all; a seeded request's answer (``sampling_params["seed"]``) is the same either way
and on either engine, up to float rounding of the logits.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

NO_HINT = -1


@dataclass(frozen=True)
class SamplingKey:
    """The settings a batch must share."""

    temperature: float
    top_p: float
    top_k: int
    stop_ids: tuple[int, ...]


def filter_scores(scores: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Top-k then top-p (nucleus) filtering of temperature-scaled scores (B, V); removed = -inf."""
    if 0 < top_k < scores.shape[-1]:
        kth = torch.topk(scores, top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        ordered, index = scores.sort(dim=-1, descending=True)
        probs = torch.softmax(ordered, dim=-1)
        drop = (probs.cumsum(-1) - probs) > top_p  # the mass before this token already exceeds top_p
        ordered = ordered.masked_fill(drop, float("-inf"))
        scores = torch.full_like(scores, float("-inf")).scatter(-1, index, ordered)
    return scores


def target_probs(logits: torch.Tensor, key: SamplingKey) -> torch.Tensor:
    """The distribution a sampled token is drawn from: softmax of the filtered ``logits / T`` (N, V)."""
    return torch.softmax(filter_scores(logits.float() / key.temperature, key.top_k, key.top_p), dim=-1)


def hint_mass(probs: torch.Tensor, hints: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(p(hint), total mass)`` per row of (N, V) ``probs``, float64; ``p(hint) = 0`` for no hint.

    The total is summed rather than taken as 1 so that ``u * total`` stays inside the CDF whatever
    the float32 softmax's rounding; the acceptance test of the speculative decoder and
    :func:`hinted_draw` must use these same two numbers for a position.
    """
    has = hints >= 0
    ph = probs.gather(1, hints.clamp(min=0)[:, None]).squeeze(1).double()
    return torch.where(has, ph, torch.zeros_like(ph)), probs.sum(dim=-1, dtype=torch.float64)


def hinted_draw(probs: torch.Tensor, hints: torch.Tensor, u: torch.Tensor,
                mass: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """One token (N,) per row of ``probs`` (N, V) from uniforms ``u`` (N,) in [0, 1): the inverse CDF
    with ``hints[i]`` (``-1`` = none) ordered first (module docstring).

    One uniform per row instead of one per vocabulary entry: ``torch.multinomial`` draws N x V
    exponentials, ~8 ms per decode step for 8 rows of SmolLM2's 49k-token vocabulary on a 2-core
    CPU. A token of probability 0 (cut by top-k/top-p) is never drawn: its CDF step is empty.
    ``mass`` is :func:`hint_mass`'s result when the caller already has it.
    """
    ph, total = mass if mass is not None else hint_mass(probs, hints)
    x = u.to(total.device, torch.float64) * total
    take = x < ph  # false for rows without a hint (ph = 0 <= x)
    rest = probs.double()
    has = hints >= 0
    if bool(has.any()):
        rest = rest.scatter(1, hints.clamp(min=0)[:, None], 0.0).where(has[:, None], rest)
    cdf = rest.cumsum(dim=-1)
    # The largest value strictly below the rest's mass: rounding never lets y reach past the last
    # token that has mass (searchsorted would then return a token of probability 0).
    top = torch.nextafter(cdf[:, -1], torch.zeros_like(cdf[:, -1]))
    y = torch.minimum((x - ph).clamp(min=0), top)
    drawn = torch.searchsorted(cdf, y[:, None], right=True).squeeze(1).clamp_(max=probs.shape[1] - 1)
    return torch.where(take, hints, drawn)


def sample_categorical(probs: torch.Tensor, generator: torch.Generator | None = None,
                       row_generators: Sequence[torch.Generator | None] | None = None,
                       hints: torch.Tensor | None = None) -> torch.Tensor:
    """One draw (B,) from each row of (B, V) probabilities (:func:`hinted_draw`).

    ``row_generators`` (one per row; ``None`` entries, or no list, draw from ``generator``) give a
    row its own stream, so its draw does not depend on the other rows of the batch.
    """
    if hints is None:
        hints = torch.full((probs.shape[0],), NO_HINT, dtype=torch.long, device=probs.device)
    u = _uniforms(probs.shape[0], generator, row_generators)[:, 0]
    return hinted_draw(probs, hints.to(probs.device), u)


def _uniforms(n: int, generator: torch.Generator | None,
              row_generators: Sequence[torch.Generator | None] | None) -> torch.Tensor:
    """(n, 1) uniforms in float64: row i's from ``row_generators[i]`` where it has one.

    The shared stream still gives all n numbers whenever some row uses it, so a row without a
    generator gets the very number it would get if no row had one (seeding one request does not
    change its batch-mates' samples). When every row has its own, the shared stream is untouched.
    """
    own = [(i, g) for i, g in enumerate(row_generators or ()) if g is not None]
    if len(own) == n:
        u = torch.empty(n, 1, dtype=torch.float64)
    else:
        u = torch.rand(n, 1, dtype=torch.float64, generator=generator)
    for i, g in own:
        u[i] = row_uniform(g)
    return u


def row_uniform(generator: torch.Generator) -> float:
    """The next uniform of a row's own stream: one ``torch.rand(1)`` per sampled token, the same
    call in every decoder, so a seeded row's ``t``-th token always uses its ``t``-th number."""
    return float(torch.rand(1, dtype=torch.float64, generator=generator))


Chooser = Callable[..., torch.Tensor]


def make_chooser(key: SamplingKey, generator: torch.Generator | None = None,
                 row_generators: Sequence[torch.Generator | None] | None = None) -> Chooser:
    """``choose(logits (B, V), rows, hints=None)``: the next tokens (B,) under ``key``'s settings.

    ``rows`` are the batch rows' indices into ``row_generators`` (``None`` = all of them, in
    order): the decode loop drops finished rows, and each remaining row must keep drawing from its
    own generator. ``hints`` (B,) are the rows' prompt-lookup predictions (``-1`` = none; module
    docstring). Greedy (temperature 0) takes the argmax and draws nothing.
    """
    def choose(logits: torch.Tensor, rows: torch.Tensor | None = None,
               hints: torch.Tensor | None = None) -> torch.Tensor:
        if key.temperature <= 0:
            return logits.argmax(dim=-1)
        gens = row_generators
        if gens is not None and rows is not None:
            gens = [gens[i] for i in rows.tolist()]
        return sample_categorical(target_probs(logits, key), generator, gens, hints)

    return choose


def row_streams(seeds: Sequence[int | None], generator: torch.Generator | None) -> list[torch.Generator]:
    """One generator per row for the speculative decoder: a seeded row's own (``seeds[i]``), an
    unseeded row's seeded from the shared stream (``generator``; ``None`` = torch's global RNG).

    The speculative decoder draws a variable number of uniforms per row and step, so rows cannot
    share one stream in a fixed pattern as :func:`_uniforms` does; instead the shared stream gives
    every row a seed once per batch (all rows, seeded or not, whenever some row is unseeded, so
    seeding one request does not change what its unseeded batch-mates draw).
    """
    drawn: list[int] = []
    if any(s is None for s in seeds):
        drawn = torch.randint(0, 2**62, (len(seeds),), generator=generator).tolist()
    return [torch.Generator().manual_seed(s if s is not None else drawn[i]) for i, s in enumerate(seeds)]
