"""verl on a machine without an accelerator: a CPU platform, gloo process groups, CPU resource pools.

verl 0.9.1 ships CUDA, NPU and ROCm platforms. This module adds the CPU through verl's own
plug-in points, so verl's workers, trainer and agent loop run unchanged on CPU processes:

* :class:`CpuPlatform`, registered as ``cpu`` in verl's ``PlatformRegistry`` and chosen with
  ``VERL_PLATFORM=cpu``. It is never auto-detected (a GPU machine keeps its GPU platform).
* :class:`CpuActorRolloutRefWorker`: verl's hybrid worker, opening a ``gloo`` process group
  before verl's own would ask for ``cpu:gloo,cpu:gloo`` (which torch refuses), and registering
  verl's FSDP engine for the ``cpu`` device (verl registers it for cuda/npu only).
* :class:`CpuResourcePoolManager`: verl's pools count GPUs; these count process slots (:data:`SLOT_RESOURCE`).

Every Ray process imports this module through ``VERL_USE_EXTERNAL_MODULES`` (verl's
``__init__`` reads it), set in the Ray runtime env by :func:`cpu_runtime_env`;
:mod:`seal.trainer.verl.cpu_rollout` adds the ``seal_cpu`` rollout replica the same way.
"""

from __future__ import annotations

import contextlib
import logging
import os
import types
from collections.abc import Iterator
from typing import Any

import torch
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry

logger = logging.getLogger(__name__)

PLATFORM_NAME = "cpu"
# The Ray resource that stands for one verl process slot (an FSDP rank) on a CPU node: a local
# cluster gets trainer.n_gpus_per_node of them; a node joining a cluster offers them with
# ``ray start --resources='{"seal_cpu_slot": K}'``.
SLOT_RESOURCE = "seal_cpu_slot"
# What every Ray process imports at ``import verl`` (comma-separated module names).
PLUGIN_MODULES = "seal.trainer.verl.cpu,seal.trainer.verl.cpu_rollout"


class CpuDeviceModule(types.ModuleType):
    """``torch.cpu`` plus the accelerator-module calls verl makes around a step: memory figures
    for its logs read 0, cache emptying does nothing, RNG state is the CPU generator's (saved
    and restored with checkpoints), and the device name is the one verl's MFU estimate uses."""

    def __init__(self) -> None:
        super().__init__("seal_cpu_device_module")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(torch.cpu, name)

    @staticmethod
    def get_device_name(*_: Any) -> str:
        return "CPU"

    @staticmethod
    def mem_get_info(*_: Any) -> tuple[int, int]:
        return 0, 0

    @staticmethod
    def memory_allocated(*_: Any) -> int:
        return 0

    max_memory_allocated = memory_reserved = max_memory_reserved = memory_allocated

    @staticmethod
    def empty_cache() -> None:
        pass

    @staticmethod
    def reset_peak_memory_stats(*_: Any) -> None:
        pass

    @staticmethod
    def get_rng_state(*_: Any) -> torch.Tensor:
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, *_: Any) -> None:
        torch.set_rng_state(state)

    @staticmethod
    def manual_seed(seed: int) -> None:
        torch.manual_seed(seed)

    manual_seed_all = manual_seed


@PlatformRegistry.register(PLATFORM_NAME)
class CpuPlatform(PlatformBase):
    """The CPU as a verl platform: gloo collectives, Ray CPUs as the per-process resource."""

    device_name = "cpu"
    vendor_name = "cpu"
    device_module = CpuDeviceModule()

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return False  # chosen only by name (VERL_PLATFORM=cpu), never over a real accelerator

    def current_device(self) -> str:  # what verl passes to ``.to()``
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        pass

    def synchronize(self, device_index: int | None = None) -> None:
        pass

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    manual_seed_all = manual_seed

    def set_allocator_settings(self, settings: str) -> None:
        pass

    def empty_cache(self) -> None:
        pass

    def get_device_capability(self, device_index: int = 0) -> tuple[None, None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str) -> Iterator[None]:
        yield

    def profiler_start(self) -> None:
        pass

    def profiler_stop(self) -> None:
        pass

    def ray_resource_name(self) -> str:
        # verl places each node's ranks in one placement group of {"CPU": colocate count, <this>: 1}
        # bundles, as it does with GPUs: a node offers as many slots as the ranks it may host, so
        # the groups of a multi-node run land on distinct nodes.
        return SLOT_RESOURCE

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> None:
        return None


def platform_selected() -> bool:
    """Whether this process runs verl on the CPU platform."""
    return os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM_NAME


def register_cpu_engine() -> None:
    """verl's FSDP engine for the ``cpu`` device: its code reaches the device through the
    platform, but verl 0.9.1 registers it for cuda/npu only."""
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    backends = EngineRegistry._engines.get("language_model", {})
    missing = [b for b in ("fsdp", "fsdp2") if PLATFORM_NAME not in backends.get(b, {})]
    if missing:
        EngineRegistry.register(model_type="language_model", backend=missing, device=PLATFORM_NAME)(
            FSDPEngineWithLMHead)


def open_gloo_group() -> None:
    """The process group verl's workers join, as gloo (verl would build ``cpu:gloo,cpu:gloo``)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo", rank=int(os.environ.get("RANK", 0)),
                                world_size=int(os.environ.get("WORLD_SIZE", 1)))


def _cpu_worker_class() -> type:
    from verl.workers.engine_workers import ActorRolloutRefWorker

    class CpuActorRolloutRefWorker(ActorRolloutRefWorker):
        """verl's hybrid actor/rollout/reference worker on the CPU platform."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            open_gloo_group()
            register_cpu_engine()
            super().__init__(*args, **kwargs)

    return CpuActorRolloutRefWorker


def __getattr__(name: str) -> Any:
    # Built on first use: importing verl's workers at plug-in import time (inside ``import
    # verl``) would import verl while it is still initialising.
    if name == "CpuActorRolloutRefWorker":
        cls = _cpu_worker_class()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def resource_pool_manager_class() -> type:
    from verl.single_controller.ray.base import ResourcePoolManager

    class CpuResourcePoolManager(ResourcePoolManager):
        """verl's pools with each process slot a Ray CPU, checked against the cluster's CPUs."""

        def _check_resource_available(self) -> None:
            import ray

            free = sorted((node["Resources"].get(SLOT_RESOURCE, 0) for node in ray.nodes() if node["Alive"]),
                          reverse=True)
            for pool, nodes in self.resource_pool_spec.items():
                wanted = sorted(nodes, reverse=True)
                if len(free) < len(wanted) or any(f < n for f, n in zip(free, wanted)):
                    raise ValueError(
                        f"verl's {pool} needs {len(nodes)} node(s) with {max(nodes)} {SLOT_RESOURCE} each "
                        f"(trainer.nnodes x trainer.n_gpus_per_node) and the Ray cluster's nodes offer {free}: "
                        f"start each node with --resources='{{\"{SLOT_RESOURCE}\": {max(nodes)}}}'")

    return CpuResourcePoolManager


def cpu_runtime_env(env_vars: dict[str, str]) -> dict[str, str]:
    """``env_vars`` plus what makes each Ray process run verl on this platform."""
    modules = [m for m in (env_vars.get("VERL_USE_EXTERNAL_MODULES") or "").split(",") if m]
    for module in PLUGIN_MODULES.split(","):
        if module not in modules:
            modules.append(module)
    return {**env_vars, "VERL_PLATFORM": PLATFORM_NAME, "VERL_USE_EXTERNAL_MODULES": ",".join(modules)}


def use_cpu_platform_here() -> None:
    """This (driver) process on the CPU platform too: verl reads the platform at start-up."""
    from verl.plugin.platform import platform_manager

    os.environ["VERL_PLATFORM"] = PLATFORM_NAME
    if not isinstance(platform_manager._current_platform, CpuPlatform):
        # Assigned, not set_platform(): verl's fallback guess at import time was never used.
        platform_manager._current_platform = CpuPlatform()


def _set(cfg: Any, key: str, value: Any, changes: list[str], *, only_if: Any = None) -> None:
    from omegaconf import OmegaConf

    current = OmegaConf.select(cfg, key)
    if current == value or (only_if is not None and current not in only_if):
        return
    OmegaConf.update(cfg, key, value, merge=False, force_add=True)
    changes.append(f"{key}={value}")


def joins_cluster(cfg: Any) -> bool:
    """Whether the run joins a running Ray cluster (``ray_kwargs.ray_init.address`` or ``RAY_ADDRESS``)."""
    from omegaconf import OmegaConf

    return bool(OmegaConf.select(cfg, "ray_kwargs.ray_init.address") or os.environ.get("RAY_ADDRESS"))


def adapt_to_cpu(cfg: Any) -> list[str]:
    """The settings verl needs on the CPU platform, applied in place to a prepared config; returns
    the ``key=value`` changes (also logged in one line).

    * FSDP2 (FSDP1 cannot hold CPU parameters), fp32 parameters and reductions (a CPU without
      bf16 instructions emulates bf16 slowly), no torch.compile;
    * a trainable reference engine (``forward_only`` pins CPU-offloaded memory, which needs an
      accelerator) with the actor's optimizer settings, never stepped;
    * the ``seal_cpu`` rollout in place of vLLM/SGLang;
    * the platform and the plug-in modules in every Ray process; on a cluster it starts itself,
      enough logical Ray CPUs for the runner, TransferQueue and agent-loop workers, and
      ``trainer.n_gpus_per_node`` process slots (:data:`SLOT_RESOURCE`);
    * one TransferQueue storage unit (verl's default of 8 each holds a logical CPU).
    """
    from omegaconf import OmegaConf, open_dict

    changes: list[str] = []
    fp32 = {"param_dtype": "fp32", "reduce_dtype": "fp32", "buffer_dtype": "fp32"}
    with open_dict(cfg):
        _set(cfg, "trainer.device", "cpu", changes)
        for role in ("actor", "ref"):
            section = f"actor_rollout_ref.{role}"
            _set(cfg, f"{section}.strategy", "fsdp2", changes, only_if=("fsdp",))
            _set(cfg, f"{section}.fsdp_config.strategy", "fsdp2", changes, only_if=("fsdp",))
            _set(cfg, f"{section}.use_torch_compile", False, changes, only_if=(True,))
            _set(cfg, f"{section}.fsdp_config.use_torch_compile", False, changes, only_if=(True,))
            if OmegaConf.select(cfg, f"{section}.fsdp_config.mixed_precision") is None:
                _set(cfg, f"{section}.fsdp_config.mixed_precision", fp32, changes)
        _set(cfg, "actor_rollout_ref.ref.fsdp_config.forward_only", False, changes, only_if=(True,))
        if OmegaConf.select(cfg, "actor_rollout_ref.ref.optim") is None:
            OmegaConf.update(cfg, "actor_rollout_ref.ref.optim", OmegaConf.to_container(cfg.actor_rollout_ref.actor.optim),
                             merge=False, force_add=True)
            changes.append("actor_rollout_ref.ref.optim=<the actor's>")
        from seal.trainer.verl.cpu_rollout import ROLLOUT_NAME

        _set(cfg, "actor_rollout_ref.rollout.name", ROLLOUT_NAME, changes, only_if=("vllm", "sglang", "trtllm"))
        # TransferQueue's storage units each hold a logical Ray CPU; verl's default of 8 would leave
        # too few for the worker slots of a CPU cluster.
        _set(cfg, "transfer_queue.backend.SimpleStorage.num_data_storage_units", 1, changes, only_if=(8,))
        if joins_cluster(cfg):
            # Ray refuses a CPU count when joining a cluster: the nodes declare their own.
            _set(cfg, "ray_kwargs.ray_init.num_cpus", None, changes)
        else:
            if not OmegaConf.select(cfg, "ray_kwargs.ray_init.num_cpus"):
                _set(cfg, "ray_kwargs.ray_init.num_cpus", max(16, os.cpu_count() or 1), changes)
            _set(cfg, f"ray_kwargs.ray_init.resources.{SLOT_RESOURCE}", int(cfg.trainer.n_gpus_per_node), changes)
        env_vars = dict(OmegaConf.select(cfg, "ray_kwargs.ray_init.runtime_env.env_vars") or {})
        OmegaConf.update(cfg, "ray_kwargs.ray_init.runtime_env.env_vars", cpu_runtime_env(env_vars),
                         merge=False, force_add=True)
    logger.info("verl on the CPU platform (no accelerator here, or trainer.device=cpu): %s",
                ", ".join(changes) or "the config already has every CPU setting")
    return changes


@contextlib.contextmanager
def in_process() -> Iterator[None]:
    """verl's workers in this process on the CPU platform, without Ray (tests, notebooks): the
    platform, a one-process gloo group, the FSDP engine for ``cpu``, and the environment
    variables verl's ``Worker`` reads; all undone on exit, including what ``Worker`` writes."""
    import socket

    import torch.distributed as dist
    from verl.plugin.platform import platform_manager

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port), "REDIS_STORE_SERVER_HOST": "", "VERL_PLATFORM": PLATFORM_NAME}
    saved_env = {key: os.environ.get(key) for key in (*env, "RAY_LOCAL_WORLD_SIZE")}
    saved_platform = platform_manager._current_platform
    platform_manager._current_platform = CpuPlatform()
    os.environ.update(env)
    created = not dist.is_initialized()
    try:
        if created:
            open_gloo_group()
        register_cpu_engine()
        yield
    finally:
        if created and dist.is_initialized():
            dist.destroy_process_group()
        platform_manager._current_platform = saved_platform
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
