"""Stand-ins for what needs a GPU or a Ray cluster, around verl's real classes.

* :class:`RoutedServer` — the LLM (vLLM in production): a scripted ``server_manager`` that picks
  each episode's behaviour from the task whose question is in the prompt.
* :func:`rollout_manager` — verl's real ``AgentLoopManager`` and ``AgentLoopWorker`` (chunking,
  per-episode instantiation from ``agent_loops.yaml``, post-processing, ``DataProto.concat``);
  only the Ray actor handles are replaced by in-process calls.
* :class:`ActorWorkers` / :class:`RefWorkers` — the FSDP worker groups: log-probs of the right
  no-padding layout and a recorded ``update_actor``.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import torch
from omegaconf import OmegaConf

FILLER = "The quick brown fox jumps over the lazy dog. "


class RoutedServer:
    """``behaviours`` maps a snippet of a task's first question to a script: a list of
    completions (text, or ``"raise"`` / ``"abort"`` / ``"flood"`` / ``"nologprobs"``), played
    in order by every episode of that task (the call number is read off the prompt, so the
    concurrent episodes of one task do not share a position)."""

    def __init__(self, tokenizer: Any, eos: int, behaviours: dict[str, list[str]]) -> None:
        self.tokenizer, self.eos = tokenizer, eos
        self.behaviours = {k: list(v) for k, v in behaviours.items()}
        self.calls = 0

    def _script(self, prompt_ids: list[int]) -> list[str]:
        text = self.tokenizer.decode(prompt_ids)
        for snippet, script in self.behaviours.items():
            if snippet in text:
                return script
        raise AssertionError("no scripted behaviour for this prompt")

    async def generate(self, request_id: str, prompt_ids: list[int], sampling_params: dict, **kw: Any) -> Any:
        from verl.workers.rollout.replica import TokenOutput

        self.calls += 1
        script = self._script(prompt_ids)
        call = self.tokenizer.decode(prompt_ids).count("<|im_start|>assistant") - 1
        action = script[call] if call < len(script) else "Done."
        want = bool(sampling_params.get("logprobs"))
        if action == "raise":
            raise RuntimeError("scripted server failure")
        if action == "abort":
            return TokenOutput(token_ids=[], log_probs=[] if want else None, stop_reason="aborted")
        if action == "flood":  # a tool call (the turn goes on), then text up to the token budget
            text = '<tool_call>\n{"name": "get_stock_info", "arguments": {"symbol": "NVDA"}}\n</tool_call>\n'
            ids = self.tokenizer.encode(text + FILLER * 2000, add_special_tokens=False)[: int(sampling_params["max_tokens"])]
        else:
            ids = self.tokenizer.encode(action, add_special_tokens=False) + [self.eos]
        logprobs = [-0.5] * len(ids) if want and action != "nologprobs" else None
        return TokenOutput(token_ids=ids, log_probs=logprobs, stop_reason="completed")


class _Remote:
    """``handle.generate_sequences.remote(chunk)`` of a Ray actor, run in process."""

    def __init__(self, worker: Any) -> None:
        self.generate_sequences = SimpleNamespace(remote=lambda chunk: worker.generate_sequences(chunk))


def agent_loop_worker(cfg: Any, tokenizer: Any, server: Any) -> Any:
    """verl's ``AgentLoopWorker`` with the state its ``__init__`` would set (no Ray, no model)."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker, _agent_loop_registry
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from seal.trainer.verl.main import AGENT_LOOPS_YAML

    for entry in OmegaConf.load(AGENT_LOOPS_YAML):  # what __init__ does with agent_loop_config_path
        _agent_loop_registry[entry.name] = entry
    rollout = cfg.actor_rollout_ref.rollout
    worker = object.__new__(AgentLoopWorker)
    worker.config = cfg
    worker.rollout_config = SimpleNamespace(
        prompt_length=int(rollout.prompt_length), response_length=int(rollout.response_length),
        temperature=float(rollout.temperature), top_p=float(rollout.top_p), top_k=int(rollout.top_k),
        calculate_log_probs=bool(rollout.calculate_log_probs), val_kwargs=rollout.val_kwargs,
        agent=SimpleNamespace(default_agent_loop=str(rollout.agent.default_agent_loop)))
    worker.llm_client, worker.tokenizer, worker.processor = server, tokenizer, None
    worker.hf_model_type = None  # as verl's worker passes it for a config.json it cannot map
    worker.dataset_cls, worker.tools, worker.mm_processor_kwargs = RLHFDataset, [], {}
    worker.distillation_enabled = False
    worker.reward_loop_worker_handles = ["reward-loop"]  # verl's default: a reward loop exists
    return worker


def rollout_manager(cfg: Any, tokenizer: Any, server: Any, num_workers: int = 2) -> Any:
    """verl's ``AgentLoopManager`` over ``num_workers`` in-process agent-loop workers."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopManager

    manager = object.__new__(AgentLoopManager)
    manager.agent_loop_workers = [_Remote(agent_loop_worker(cfg, tokenizer, server)) for _ in range(num_workers)]
    return manager


def _like_input(batch_td: Any, value: float) -> Any:
    ids = batch_td["input_ids"]
    return torch.nested.nested_tensor_from_jagged(torch.full(ids.values().shape, value), offsets=ids.offsets())


class ActorWorkers:
    """The FSDP actor/rollout worker group: constant log-probs, a recorded update."""

    def __init__(self) -> None:
        self.updates: list[Any] = []
        self.log_prob_calls = 0
        self._dispatch_info = {"actor": [0]}  # one data-parallel rank (verl's _balance_batch reads it)

    def compute_log_prob(self, batch_td: Any) -> Any:
        from verl.utils import tensordict_utils as tu

        self.log_prob_calls += 1
        return tu.get_tensordict({"log_probs": _like_input(batch_td, -0.5), "entropy": _like_input(batch_td, 1.0)},
                                 non_tensor_dict={"metrics": {"mfu": 0.0}})

    def update_actor(self, batch_td: Any) -> Any:
        from verl.utils import tensordict_utils as tu

        self.updates.append(batch_td)
        return tu.get_tensordict(tensor_dict={}, non_tensor_dict={"metrics": {"pg_loss": 0.5, "mfu": 0.0}})


class RefWorkers:
    """The reference-policy worker group."""

    def __init__(self) -> None:
        self.calls = 0

    def compute_ref_log_prob(self, batch_td: Any) -> Any:
        from verl.utils import tensordict_utils as tu

        self.calls += 1
        return tu.get_tensordict({"log_probs": _like_input(batch_td, -0.6)})


class CheckpointEngine:
    """verl's checkpoint-engine manager (weight sync to the rollout servers)."""

    def __init__(self) -> None:
        self.synced: list[int] = []

    def update_weights(self, step: int) -> None:
        self.synced.append(step)

    def sleep_replicas(self) -> None:
        pass


def run(coro: Any) -> Any:
    return asyncio.run(coro)
