"""One verl actor update moves each response's log-probability with its advantage's sign.

The update runs the way ``fit()`` runs it, minus Ray: :meth:`SealRayPPOTrainer._update_actor`
(SEAL's step: observe, A-Patch on the advantages), verl's ``RayPPOTrainer._update_actor``
(padding removal, mini-batch settings), then verl's own actor worker
(``verl.workers.engine_workers.ActorRolloutRefWorker.update_actor`` -> ``TrainingWorker`` -> the
FSDP engine with ``verl.workers.utils.losses.ppo_loss``), in this process, on a tiny random
Llama. verl 0.9.1 has no ``DataParallelPPOActor``: this worker is its actor update. The config
is the SEAL recipe as :func:`seal.trainer.verl.main.prepare_config` hands it to the workers on a
machine without flash-attn (sdpa, no padding removal), with a few test sizes.

The batch is one GRPO group of two multi-turn responses (model turn, tool observation with mask
0, model turn) with advantage +1 on one and -1 on the other, set on every response token so the
loss mask alone keeps the observations out of training. The same update with the loss fed a
flipped advantage sign or an inverted mask must fail the direction check
(:mod:`update_direction`); the sabotaged cases assert that it does.

Running verl's worker on CPU takes three test-only settings (the ``cpu_verl`` fixture), each
undone afterwards: a CPU platform through verl's platform plug-in interface (verl otherwise
falls back to CUDA), a one-process gloo group (the worker would ask for ``cpu:gloo,cpu:gloo``),
and ``VERL_ENGINE_DEVICE=cuda`` so the engine registry picks the FSDP engine (registered for
cuda/npu only; its code reaches the device through the platform). The reference policy's
log-probs are the old policy's: before the first update the policy is the reference (verl's
forward-only reference worker pins CPU-offloaded memory, which needs an accelerator).
"""

from __future__ import annotations

import contextlib
import socket
import types
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from update_direction import SABOTAGES, describe, direction_held, row_changes, sabotaged
from verl_testkit import episode_fields, make_trainer

from seal.config import compose_config
from seal.episode import FIELD_NAMES
from seal_shared.types import FailureTag

pytest.importorskip("verl")

from verl import DataProto  # noqa: E402
from verl.plugin.platform import platform_manager  # noqa: E402
from verl.plugin.platform.platform_base import PlatformBase  # noqa: E402

VOCAB = 128
PROMPT_LEN, PROMPT_PAD = 10, 2  # left padding, as verl's batches have
RESPONSE_MASK = [1] * 6 + [0] * 5 + [1] * 4  # model turn, tool observation, model turn
LR = 1e-2
STEP = 3  # a step where A-Patch rescales rows


class _CpuDeviceModule(types.ModuleType):
    """``torch.cpu`` plus the accelerator-module calls verl makes around an update: memory
    figures for its logs read 0, cache emptying does nothing, and the device name is the one
    verl's MFU estimate uses for a CPU."""

    def __init__(self) -> None:
        super().__init__("cpu_device_module")

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


class _CpuPlatform(PlatformBase):
    """The CPU as a verl platform (verl 0.9.1 ships CUDA, NPU and ROCm ones only)."""

    device_name = "cpu"
    vendor_name = "cpu"
    device_module = _CpuDeviceModule()

    def is_available(self) -> bool:
        return True

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
        return "CPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> None:
        return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cpu_verl() -> Iterator[None]:
    """verl's workers in this process on the CPU (see the module docstring); undone afterwards,
    including the environment variables verl's ``Worker`` writes."""
    import torch.distributed as dist

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(platform_manager, "_current_platform", _CpuPlatform())
        env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "REDIS_STORE_SERVER_HOST": "",
               "VERL_ENGINE_DEVICE": "cuda"}
        for key, value in env.items():
            mp.setenv(key, value)
        created = not dist.is_initialized()
        if created:
            dist.init_process_group("gloo", rank=0, world_size=1)
        try:
            yield
        finally:
            if created:
                dist.destroy_process_group()


@pytest.fixture(scope="module")
def recipe(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The SEAL recipe as the workers get it without flash-attn, on a tiny random Llama saved
    to disk (the worker loads its model from a path)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from seal.trainer.verl.main import prepare_config

    root = tmp_path_factory.mktemp("verl_direction")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0)
    LlamaForCausalLM(config).save_pretrained(root / "model")
    cfg = compose_config("exp/SEAL.yaml", [
        f"actor_rollout_ref.model.path={root / 'model'}",
        "+actor_rollout_ref.model.load_tokenizer=false",  # the batch is token ids already
        "actor_rollout_ref.model.enable_gradient_checkpointing=false",
        # The recipe's FSDP1 cannot hold CPU parameters (torch refuses them with the
        # sync_module_states=True verl sets); FSDP2 is verl's other FSDP strategy, same engine.
        "actor_rollout_ref.actor.strategy=fsdp2",
        "actor_rollout_ref.actor.fsdp_config.use_torch_compile=false",
        "actor_rollout_ref.actor.use_torch_compile=false",
        # fp32 forward passes, so the log-prob changes are measured exactly (the recipe: bf16).
        "+actor_rollout_ref.actor.fsdp_config.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}",
        f"actor_rollout_ref.actor.optim.lr={LR}",
        # One group of 2 responses = one mini-batch = one optimizer step (2 micro-batches of 1).
        "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=1",
    ])
    return prepare_config(cfg, exp_dir=root / "exp", base=root, flash_attn=False)


def _object_column(values: list[Any]) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def multi_turn_group(seed: int = 1) -> DataProto:
    """Two responses to one prompt (one GRPO group) as ``fit()`` holds them before the old
    log-probs: left-padded prompts, equal-length responses, the episode runner's record columns.
    Advantages +1 / -1 on every response token."""
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(3, VOCAB, (PROMPT_LEN,), generator=g)
    prompts = prompt.repeat(2, 1)
    prompts[:, :PROMPT_PAD] = 0
    prompt_mask = torch.ones_like(prompts)
    prompt_mask[:, :PROMPT_PAD] = 0
    responses = torch.randint(3, VOCAB, (2, len(RESPONSE_MASK)), generator=g)
    attention_mask = torch.cat([prompt_mask, torch.ones_like(responses)], dim=1)
    advantages = torch.tensor([[1.0], [-1.0]]).expand(2, len(RESPONSE_MASK)).clone()
    records = [episode_fields("multi_turn_base_3", 1.0, [FailureTag.PASS]),
               episode_fields("multi_turn_base_3", 0.0, [FailureTag.STATE_MISMATCH])]
    return DataProto.from_single_dict({
        "prompts": prompts, "responses": responses, "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask, "position_ids": (attention_mask.cumsum(dim=1) - 1).clamp(min=0),
        "response_mask": torch.tensor([RESPONSE_MASK] * 2), "advantages": advantages, "returns": advantages.clone(),
        "token_level_rewards": torch.zeros_like(advantages), "uid": _object_column(["g0", "g0"]),
        **{name: _object_column([r[name] for r in records]) for name in FIELD_NAMES},
    }, meta_info={"temperature": 1.0, "global_token_num": attention_mask.sum(dim=1).tolist()})


def hf_response_logprobs(model_dir: str, batch: DataProto) -> torch.Tensor:
    """The responses' log-probs from a plain transformers forward of the saved model."""
    from transformers import AutoModelForCausalLM

    from seal.trainer.local.policy import response_logprobs

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
    with torch.no_grad():
        return torch.stack([
            response_logprobs(model, p[PROMPT_PAD:].tolist(), r.tolist(), torch.device("cpu"))
            for p, r in zip(batch.batch["prompts"], batch.batch["responses"])])


@pytest.mark.parametrize("sabotage", SABOTAGES)
def test_one_verl_update_follows_the_advantage_sign(sabotage: str | None, cpu_verl: None, recipe: Any,
                                                    tmp_path: Path) -> None:
    """+1 raises the model-written tokens' log-probs, -1 lowers them, the observations move
    less; with the loss's advantage sign or mask flipped (``sabotage``) that no longer holds."""
    from verl.workers.engine_workers import ActorRolloutRefWorker
    from verl.workers.utils.losses import ppo_loss

    worker = ActorRolloutRefWorker(config=recipe.actor_rollout_ref, role="actor")
    worker.init_model()
    actor_config = worker.loss_fn.keywords["config"]
    assert actor_config.use_kl_loss and actor_config.kl_loss_type == "low_var_kl"

    def loss(config: Any, model_output: Any, data: Any, dp_group: Any = None) -> Any:
        data["advantages"], data["response_mask"] = sabotaged(data["advantages"], data["response_mask"], sabotage)
        return ppo_loss(config, model_output, data, dp_group)

    worker.set_loss_fn(partial(loss, config=actor_config))
    trainer = make_trainer(recipe, tmp_path, step=STEP)
    trainer.actor_rollout_wg = worker

    batch = multi_turn_group()
    old, _ = trainer._compute_old_log_prob(batch)
    before = old.batch["old_log_probs"]
    # The worker's log-probs are the model's: the in-process CPU setup computes what it should.
    torch.testing.assert_close(before, hf_response_logprobs(recipe.actor_rollout_ref.model.path, batch),
                               atol=1e-5, rtol=1e-5)
    batch = batch.union(old)
    batch.batch["ref_log_prob"] = before.clone()  # the policy is the reference before its first update

    out = trainer._update_actor(batch)
    after = trainer._compute_old_log_prob(batch)[0].batch["old_log_probs"]

    metrics = out.meta_info["metrics"]
    assert metrics["seal/apatch/scaled_count"] == 2.0 and "actor/kl_loss" in metrics
    trained_advantages = batch.batch["advantages"][:, 0].tolist()  # after A-Patch
    assert trained_advantages[0] > 0 > trained_advantages[1]
    changes = row_changes(before, after, batch.batch["response_mask"], trained_advantages)
    assert direction_held(changes) is (sabotage is None), describe(changes)
