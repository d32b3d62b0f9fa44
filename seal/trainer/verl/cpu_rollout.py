"""The ``seal_cpu`` rollout for verl's agent loop: the project's CPU engine as a verl rollout replica.

verl's hybrid rollout has three parts, and this module supplies each for the CPU
(``actor_rollout_ref.rollout.name=seal_cpu``):

* :class:`SealCpuServer`, a Ray actor serving token-in/token-out ``generate`` from
  :class:`seal.engine.hf_server.HFServerManager` (batched sampling with per-token log-probs),
  as vLLM's server does for the agent-loop workers;
* :class:`SealCpuReplica`, the ``RolloutReplica`` that launches one server per replica,
  registered in verl's ``RolloutReplicaRegistry``;
* :class:`SealCpuRollout`, the ``BaseRollout`` inside the hybrid worker. After each update
  verl's worker hands it the actor's full weights (``update_weights``), which it sends to its
  server, so the next step samples from the updated policy, as vLLM's replica does in hybrid
  mode.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterable
from typing import Any

import ray
import torch
from verl.workers.rollout import base as rollout_base
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, RolloutReplicaRegistry, TokenOutput

ROLLOUT_NAME = "seal_cpu"
# The actor's weights reach a server in buckets of about this size (through Ray's object store).
WEIGHT_BUCKET_BYTES = 64 * 2**20


def server_name(replica_rank: int) -> str:
    """The Ray name of a replica's server: the hybrid worker finds it by this name."""
    return f"{ROLLOUT_NAME}_server_{replica_rank}"


class SealCpuServer:
    """One replica's generation server (a Ray actor, ``max_concurrency`` > 1: requests of all
    agent-loop workers are batched by the engine on the actor's event loop)."""

    def __init__(self, model_path: str, *, max_batch_size: int, seed: int | None) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from seal.engine.hf_server import HFServerManager

        torch.set_num_threads(max(1, int(os.environ.get("SEAL_CPU_ROLLOUT_THREADS", torch.get_num_threads()))))
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        model.eval()
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.server = HFServerManager(model, tokenizer, max_batch_size=max_batch_size, seed=seed,
                                      autocast_dtype=None)
        self.global_steps: int | None = None
        self.weight_updates = 0

    def ready(self) -> bool:
        return True

    async def generate(self, request_id: str, prompt_ids: list[int], sampling_params: dict[str, Any],
                       **kwargs: Any) -> TokenOutput:
        output = await self.server.generate(request_id, prompt_ids, sampling_params, **kwargs)
        output.extra_fields["global_steps"] = self.global_steps
        return output

    def update_weights(self, named_tensors: dict[str, torch.Tensor], *, last: bool = True) -> int:
        """Load one bucket of the actor's weights; returns how many tensors it held. Names the model
        does not have fail. The bucket marked ``last`` completes the update: the cache of the
        old weights is dropped and the update counted."""
        model = self.server.model
        own = dict(model.named_parameters(remove_duplicate=False))
        unknown = sorted(set(named_tensors) - set(own))
        if unknown:
            raise KeyError(f"the actor sent weights this model does not have: {unknown[:5]}")
        with torch.no_grad():
            for name, tensor in named_tensors.items():
                own[name].copy_(tensor.to(own[name].dtype))
        if last:
            self.server.clear_cache()
            self.weight_updates += 1
        return len(named_tensors)

    def set_global_steps(self, global_steps: int | None) -> None:
        self.global_steps = global_steps

    def stats(self) -> dict[str, Any]:
        return {"weight_updates": self.weight_updates, "global_steps": self.global_steps,
                **self.server.stats.as_dict()}

    # verl's replica control calls. Weights stay in CPU memory, so sleeping frees nothing.
    def wake_up(self, tags: list[str] | None = None) -> None:
        pass

    def sleep(self) -> None:
        pass

    def clear_kv_cache(self) -> None:
        self.server.clear_cache()

    release_kv_cache = resume_kv_cache = clear_kv_cache

    def abort_all_requests(self, reject_request: bool = False) -> None:
        pass

    def resume_generation(self) -> None:
        pass

    def start_profile(self, **kwargs: Any) -> None:
        pass

    def stop_profile(self) -> None:
        pass


class SealCpuReplica(RolloutReplica):
    """verl's rollout replica for ``seal_cpu``: one :class:`SealCpuServer` per replica."""

    def rollout_worker_use_gpu(self) -> bool:
        return False

    async def launch_servers(self) -> None:
        # Weights reach the server through Ray's object store, so it may run on any node; it
        # takes no CPU slot of verl's placement groups.
        options: dict[str, Any] = {"name": server_name(self.replica_rank), "num_cpus": 0,
                                   "max_concurrency": self.max_concurrency}
        model_path = self.model_config.local_path if hasattr(self.model_config, "local_path") \
            else self.model_config.path
        server = ray.remote(SealCpuServer).options(**options).remote(
            str(model_path), max_batch_size=int(self.config.max_num_seqs),
            seed=getattr(self.config, "seed", None))
        await server.ready.remote()
        self.servers = [server]
        self._server_handle = server
        self._server_address = server_name(self.replica_rank)


class SealCpuRollout(BaseRollout):
    """The hybrid worker's side of ``seal_cpu``: forwards the actor's weights to its server."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any, replica_rank: int = -1) -> None:
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ.get("RANK", 0))
        world = (self.config.tensor_model_parallel_size * self.config.data_parallel_size
                 * self.config.pipeline_model_parallel_size)
        self.replica_rank = rank // world if replica_rank == -1 else replica_rank
        self.sends_weights = rank % world == 0  # one rank a replica owns its server
        self._server: Any = None

    def _server_handle(self) -> Any:
        if self._server is None:
            self._server = ray.get_actor(server_name(self.replica_rank))
        return self._server

    async def update_weights(self, weights: Iterable | AsyncIterator, global_steps: int | None = None,
                             wire_format: str = "named_tensors", **kwargs: Any) -> None:
        if wire_format != "named_tensors":
            raise ValueError(f"the {ROLLOUT_NAME} rollout takes full tensors, not {wire_format!r}: "
                             "leave actor_rollout_ref.rollout.checkpoint_engine at its default")
        # Every rank drains the generator (gathering the full tensors is collective); the sending
        # rank ships them in buckets, so no process holds a second copy of the whole model.
        bucket: dict[str, torch.Tensor] = {}
        size = 0
        async for name, tensor in _each(weights):
            if not self.sends_weights:
                continue
            bucket[name] = tensor.detach().to("cpu", copy=True)
            size += bucket[name].numel() * bucket[name].element_size()
            if size >= WEIGHT_BUCKET_BYTES:
                await self._server_handle().update_weights.remote(bucket, last=False)
                bucket, size = {}, 0
        if self.sends_weights:
            server = self._server_handle()
            await server.update_weights.remote(bucket, last=True)
            await server.set_global_steps.remote(global_steps)

    async def resume(self, tags: list[str]) -> None:
        pass

    async def release(self) -> None:
        pass


async def _each(weights: Iterable | AsyncIterator) -> AsyncIterator:
    if hasattr(weights, "__aiter__"):
        async for item in weights:
            yield item
    else:
        for item in weights:
            yield item


def register() -> None:
    """Make ``actor_rollout_ref.rollout.name=seal_cpu`` known to verl in this process."""
    RolloutReplicaRegistry.register(ROLLOUT_NAME, lambda: SealCpuReplica)
    # verl 0.9.1's worker-side registry has no register call: add the entry by its key.
    rollout_base._ROLLOUT_REGISTRY[(ROLLOUT_NAME, "async")] = f"{__name__}.SealCpuRollout"


register()
