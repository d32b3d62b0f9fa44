"""Stand-ins for what needs a GPU or a Ray cluster, around verl's real V1 rollout classes.

* :class:`RoutedServer` — the LLM (vLLM in production): a scripted ``server_manager`` that picks
  each episode's behaviour from the task whose question is in the prompt.
* :func:`rollout_manager` — verl's real ``AgentLoopManagerTQ`` and ``AgentLoopWorkerTQ``
  (chunking, ``rollout.n`` sessions per prompt, per-episode instantiation from
  ``agent_loops.yaml``, post-processing into TransferQueue, the prompt's status); only the Ray
  actor handles are replaced by in-process calls.
* :func:`dispatch` — verl's own ``_next_train_batch`` / ``_submit_batch_to_rollout`` through the
  trainer's :class:`~seal.trainer.verl.trainer.EpisodeParamsDispatch`, as ``fit`` dispatches a step.

They need the ``transfer_queue`` fixture (conftest.py).
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from omegaconf import OmegaConf

FILLER = "The quick brown fox jumps over the lazy dog. "


class RoutedServer:
    """``behaviours`` maps a snippet of a task's first question to a script: a list of
    completions (text, or ``"raise"`` / ``"abort"`` / ``"flood"`` / ``"nologprobs"``), played
    in order by every episode of that task (the call number is read off the prompt, so the
    concurrent episodes of one task do not share a position). ``by_seed`` maps a request's
    sampling seed to its own script, for the episodes of one task that should differ."""

    def __init__(self, tokenizer: Any, eos: int, behaviours: dict[str, list[str]],
                 by_seed: dict[int, str] | None = None) -> None:
        self.tokenizer, self.eos = tokenizer, eos
        self.behaviours = {k: list(v) for k, v in behaviours.items()}
        self.by_seed = dict(by_seed or {})
        self.calls = 0
        self.seeds: list[Any] = []

    def _script(self, prompt_ids: list[int]) -> list[str]:
        text = self.tokenizer.decode(prompt_ids)
        for snippet, script in self.behaviours.items():
            if snippet in text:
                return script
        raise AssertionError("no scripted behaviour for this prompt")

    def _action(self, prompt_ids: list[int], sampling_params: dict) -> str:
        seed = sampling_params.get("seed")
        self.seeds.append(seed)
        if seed in self.by_seed:
            return self.by_seed[seed]
        script = self._script(prompt_ids)
        call = self.tokenizer.decode(prompt_ids).count("<|im_start|>assistant") - 1
        return script[call] if call < len(script) else "Done."

    async def generate(self, request_id: str, prompt_ids: list[int], sampling_params: dict, **kw: Any) -> Any:
        from verl.workers.rollout.replica import TokenOutput

        self.calls += 1
        action = self._action(prompt_ids, sampling_params)
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


def agent_loop_worker(cfg: Any, tokenizer: Any, server: Any) -> Any:
    """verl's ``AgentLoopWorkerTQ`` (the class under Ray's actor wrapper) with the state its
    ``__init__`` would set (no Ray, no model)."""
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from seal.trainer.verl.main import AGENT_LOOPS_YAML

    for entry in OmegaConf.load(AGENT_LOOPS_YAML):  # what __init__ does with agent_loop_config_path
        _agent_loop_registry[entry.name] = entry
    worker = object.__new__(AgentLoopWorkerTQ.__ray_metadata__.modified_class)
    worker.config = cfg
    worker.llm_client, worker.tokenizer, worker.processor = server, tokenizer, None
    worker.hf_model_type = None  # as verl's worker passes it for a config.json it cannot map
    worker.dataset_cls, worker.tools, worker.mm_processor_kwargs = RLHFDataset, [], {}
    worker.distillation_enabled = False
    worker.reward_loop_worker_handles = ["reward-loop"]  # verl's default: a reward loop exists
    worker.background_tasks = set()
    return worker


class _Remote:
    """``handle.generate_sequences.remote(chunk)`` of a Ray actor, run in this process: verl's
    worker spawns one background task per prompt; they are awaited here, so the episodes are in
    TransferQueue when the manager's ``ray.get`` returns."""

    def __init__(self, worker: Any) -> None:
        self.worker = worker
        self.generate_sequences = SimpleNamespace(remote=self._generate)

    def _generate(self, chunk: Any) -> Any:
        import ray

        async def run() -> None:
            await self.worker.generate_sequences(chunk)
            while self.worker.background_tasks:
                await asyncio.gather(*list(self.worker.background_tasks))

        asyncio.run(run())
        return ray.put(None)


def rollout_manager(cfg: Any, tokenizer: Any, server: Any, num_workers: int = 2) -> Any:
    """verl's ``AgentLoopManagerTQ`` over ``num_workers`` in-process agent-loop workers."""
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ

    manager = object.__new__(AgentLoopManagerTQ)
    manager.agent_loop_workers = [_Remote(agent_loop_worker(cfg, tokenizer, server)) for _ in range(num_workers)]
    return manager


def dispatch(trainer: Any, rows: list[dict[str, Any]], manager: Any) -> list[str]:
    """One training step's prompts dispatched as verl's ``fit`` does (``_next_train_batch``,
    ``_submit_batch_to_rollout``) through the trainer's env-params dispatch to ``manager``;
    returns the episodes' TransferQueue keys (``{uid}_{session}_{index}``)."""
    import transfer_queue as tq
    from omegaconf import open_dict
    from verl.utils.dataset.rl_dataset import collate_fn

    from seal.trainer.verl.trainer import EpisodeParamsDispatch

    trainer.train_dataloader, trainer.train_dataloader_it = [collate_fn(rows)], None
    with open_dict(trainer.config):
        trainer.config.data.gen_batch_size = len(rows)
    trainer.agent_loop_manager = EpisodeParamsDispatch(manager, trainer)
    batch = trainer._next_train_batch(len(rows))
    trainer._submit_batch_to_rollout(batch)
    uids = set(batch["uid"])
    listing = tq.kv_list("train")["train"]
    return sorted(k for k, tag in listing.items() if not tag.get("is_prompt") and k.split("_")[0] in uids)
