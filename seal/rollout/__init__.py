"""Rollout layer: the episode loop and the trainers' episode runner (the CPU generation engine it
talks to is :mod:`seal.engine`).

* :mod:`seal.rollout.episode_loop` — the one episode loop (create, limits, budget, clipping,
  faults, release) that training, validation and ``seal eval`` play through a generation adapter;
* :mod:`seal.rollout.agent_loop` — ``SealAgentLoop``, a verl ``AgentLoopBase`` registered as
  ``seal`` (alias ``seal_bfcl``): any environment's episode, token-in-token-out;
* :mod:`seal.rollout.tokens` — chat-template increments, token trace and loss mask;
* :mod:`seal.rollout.few_shot` — the optional tool-use example conversation;
* :mod:`seal.rollout.settings` — the runner's settings from the config, episode params, env client;
* :mod:`seal.rollout.prompt_length` — the rendered initial prompt's length, for the task filter.
* :mod:`seal.rollout.oracle_server` — ``OracleServer``, a server manager that answers with a task's
  ground truth (budget replays, the config task-budget test, the warm start's transcripts).

Nothing is imported here, so ``import seal.rollout.tokens`` stays light (no verl, no torch).
"""
