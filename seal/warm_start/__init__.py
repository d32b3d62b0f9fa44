"""Supervised warm start before RL (an extension; off in the paper's recipe).

A small policy that never succeeds gives GRPO nothing to learn from: every group's rewards are
equal and every advantage is 0. The warm start fine-tunes the policy on the oracle episodes of
training tasks (their ground truth replayed through the episode runner, :mod:`.transcripts`) so that
RL starts from a policy that sometimes succeeds. ``seal.warm_start`` configures it; :func:`prepare`
runs it once per fingerprint and points the run at the result.
"""

from seal.warm_start.settings import WarmStartSettings
from seal.warm_start.stage import prepare

__all__ = ["WarmStartSettings", "prepare"]
