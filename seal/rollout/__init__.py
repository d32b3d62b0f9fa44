"""Rollout layer: the BFCL episode runner and the CPU generation server.

* :mod:`seal.rollout.agent_loop` — ``BfclAgentLoop``, a verl ``AgentLoopBase`` registered as
  ``seal_bfcl`` (one BFCL episode, token-in-token-out, limits and fault handling);
* :mod:`seal.rollout.hf_server` — ``HFServerManager``, verl's ``server_manager.generate`` contract
  over a Hugging Face model, batching concurrent episodes' requests;
* :mod:`seal.rollout.kv_cache` — prefix key/value reuse and the batched decode loop of that server;
* :mod:`seal.rollout.tokens` — chat-template increments, token trace and loss mask;
* :mod:`seal.rollout.few_shot` — the optional tool-use example conversation;
* :mod:`seal.rollout.settings` — the runner's settings from the config, episode params, env client.

Nothing is imported here, so ``import seal.rollout.tokens`` stays light (no verl, no torch).
"""
