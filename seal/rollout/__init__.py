"""Rollout layer: the one episode loop (:mod:`~seal.rollout.episode_loop`), the trainers' episode
runner (:mod:`~seal.rollout.agent_loop`) and their helpers; docs/architecture.md maps each module.

Nothing is imported here, so ``import seal.rollout.tokens`` stays light (no verl, no torch).
"""
