"""How many draft positions a speculative step verifies: expected tokens per second, learned online.

A verification step over a batch of B rows and Q positions per row costs about ``a + b * B * Q``
seconds: ``a`` the per-forward part (weight reads, per-op overhead), ``b`` each position's compute.
On a 2-core CPU with a 135M model ``a`` dominates at batch 1 and ``b`` at batch 16-32 (a batch-32
step over 7 positions is ~3x one over 1), so drafting everything prompt lookup offers, at every
batch size, can be slower than not speculating. Every step therefore picks its width Q to
maximise the expected tokens per unit of cost::

    (live rows + sum_i E_i[accepted | min(n_i, Q - 1) drafted]) / (1 + B * Q / R)

where ``R = a / b`` (the positions that cost as much as the per-forward part) is fitted by
exponentially weighted least squares to the measured step times, and the expected acceptance of
a row's j-th draft token given the ones before is learned per row *state* (how its previous step
went: its whole draft accepted, part, none, no draft, or its first step), counted over the batches.

The choice changes only how fast the tokens come, never which: the decoder's output does not
depend on how many draft tokens it verifies (:mod:`seal.engine.speculative`). So timing noise, a
loaded machine or a GPU only make the choice better or worse, not the answers different.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

STATES = ("start", "no_draft", "none", "some", "all")
# Draft positions past this one share their acceptance estimate (few steps reach them).
POSITION_BUCKETS = 4
PRIOR_RATIO = 48.0  # R before any step is timed: measured 40-90 on a 2-core CPU (fp32 / bf16)
PRIOR_WEIGHT = 2.0  # pseudo-steps behind the prior R, and pseudo-drafts behind a 0.5 acceptance
DECAY = 0.98  # weight of past observations per new one (the machine's load changes)
RATIO_RANGE = (2.0, 1024.0)


def row_state(drafted: int | None, accepted: int) -> str:
    """A row's state from its previous step: ``None`` drafted = it has not had a step yet."""
    if drafted is None:
        return "start"
    if drafted == 0:
        return "no_draft"
    return "all" if accepted == drafted else "some" if accepted else "none"


@dataclass
class DraftPolicy:
    """The learned quantities of the module docstring; one per server, kept across batches."""

    prior_ratio: float = PRIOR_RATIO
    # (state, position bucket) -> [accepted, tried], prior 1 of 2
    accept: dict[tuple[str, int], list[float]] = field(default_factory=dict)
    # weighted sums of the step-time regression: w, w*N, w*N^2, w*t, w*N*t
    sums: list[float] = field(default_factory=lambda: [0.0] * 5)

    def acceptance(self, state: str, position: int) -> float:
        hit, tried = self.accept.get((state, min(position, POSITION_BUCKETS - 1)), (1.0, PRIOR_WEIGHT))
        return hit / tried

    def ratio(self) -> float:
        """``R = a / b`` from the timed steps, the prior until they say something."""
        w, sn, snn, st, snt = self.sums
        if w <= 0:
            return self.prior_ratio
        var = snn * w - sn * sn
        if var <= 1e-9 * max(snn * w, 1.0):
            return self.prior_ratio
        b = (snt * w - sn * st) / var
        a = (st - b * sn) / w
        if b <= 0 or a <= 0:
            return RATIO_RANGE[1] if b <= 0 else RATIO_RANGE[0]
        return min(max(a / b, RATIO_RANGE[0]), RATIO_RANGE[1])

    def width(self, chains: Sequence[int], states: Sequence[str], batch: int) -> int:
        """The step's Q (1 = no draft) for live rows that have ``chains[i]`` draft tokens on offer
        in ``states[i]``, in a batch of ``batch`` rows (finished ones still in it count: they
        are computed too)."""
        longest = max(chains, default=0)
        if longest == 0:
            return 1
        gains = [0.0] * (longest + 1)  # gains[q - 1]: expected accepted tokens at width q
        for n, state in zip(chains, states):
            p = 1.0
            for j in range(n):
                p *= self.acceptance(state, j)
                for q in range(j + 2, longest + 2):
                    gains[q - 1] += p
        live, r = len(chains), self.ratio()
        return max(range(1, longest + 2), key=lambda q: (live + gains[q - 1]) / (1.0 + batch * q / r))

    def observe_drafts(self, state: str, drafted: int, accepted: int) -> None:
        """One row's step: draft positions ``0 .. accepted`` were tried (the first rejection ends it)."""
        for j in range(min(drafted, accepted + 1)):
            key = (state, min(j, POSITION_BUCKETS - 1))
            hit, tried = self.accept.get(key, (1.0, PRIOR_WEIGHT))
            self.accept[key] = [hit * DECAY ** 0.1 + (j < accepted), tried * DECAY ** 0.1 + 1.0]

    def observe_step(self, positions: int, seconds: float) -> None:
        """A step that computed ``positions`` (rows x Q) in ``seconds``."""
        if self.sums[0] == 0.0:  # the prior as pseudo-steps at the scale of this first one
            a = seconds / (1.0 + positions / self.prior_ratio)
            for n in (0.0, self.prior_ratio):
                self._add(n, a * (1.0 + n / self.prior_ratio), PRIOR_WEIGHT)
        self.sums = [s * DECAY for s in self.sums]
        self._add(float(positions), seconds, 1.0)

    def _add(self, n: float, t: float, w: float) -> None:
        for i, v in enumerate((w, w * n, w * n * n, w * t, w * n * t)):
            self.sums[i] += v
