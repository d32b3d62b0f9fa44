"""The start-of-run validation, computed once.

Before its first step a run validates the policy it starts from, greedily: with a warm start that
policy is the same checkpoint in every run of a config, so every run would spend the same minutes
to write the same log. This cache keeps that greedy validation (its log and metrics) under a key
made of everything that decides it:

* the policy: a digest of its weights, as loaded (dtype included), and of its tokenizer files;
* the tasks and their prompts: the validation task ids and each one's rendered initial prompt
  (token ids), which also covers the environment's task data and interface;
* the config, less the keys that cannot change a greedy validation of the starting policy
  (:data:`NOT_DECIDING`: names, step counts, the optimizer, training sampling, ...);
* the code: every ``.py`` file of the project's packages, and the versions of torch and
  transformers;
* the machine's arithmetic: torch's CPU capability and the resolved autocast, since AVX2 and
  AVX-512 kernels, or bf16 and fp32, round differently and can flip a greedy token.

A key that differs in any part is a miss and the validation runs (and is stored); ``install.sh``
fills the quickstart's entry. Only a fresh run's step-0 validation is cached: after an update, or
on resume, nothing is read from here. Sampled validation is never cached (its draws are the run's).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from seal.config_base import REPO_ROOT, to_plain

logger = logging.getLogger(__name__)

DEFAULT_DIR = REPO_ROOT / "models" / "validation_cache"
DIR_ENV = "SEAL_VALIDATION_CACHE"  # another folder for the cache (the test suite uses its own)
PACKAGES = ("seal", "env_service", "seal_shared")

# Config paths that cannot change the greedy validation of the starting policy: where outputs go
# and how long the run lasts, the update (optimizer, loss, advantages), training-time sampling and
# task selection, the sampled validation (never cached) and where the environment service runs.
# Everything else is in the key, so a key added later is safe by default (a miss, not a stale hit).
NOT_DECIDING: tuple[str, ...] = (
    "trainer", "algorithm", "critic", "reward_model", "custom_reward_function", "reward", "distillation",
    "transfer_queue", "global_profiler", "ray_kwargs", "model_engine", "sandbox_fusion", "skip",
    "data.seed", "data.train_batch_size", "data.shuffle", "data.train_files",
    "actor_rollout_ref.actor", "actor_rollout_ref.ref", "actor_rollout_ref.model.enable_gradient_checkpointing",
    "actor_rollout_ref.rollout.n", "actor_rollout_ref.rollout.temperature", "actor_rollout_ref.rollout.top_p",
    "actor_rollout_ref.rollout.top_k", "actor_rollout_ref.rollout.seed", "actor_rollout_ref.rollout.trace",
    "env_service.url", "env_service.urls", "env_service.timeout_s",
    "seal.advantage", "seal.warm_start", "seal.local.sampled_validation_n",
    "seal.local.sampled_validation_temperature", "seal.local.tensorboard", "seal.local.progress_bars",
    "seal.local.max_fault_fraction", "seal.tasks.train_ids", "seal.tasks.max_train_tasks",
    "seal.tasks.from_tags", "seal.tasks.from_log", "seal.tasks.match_val_categories",
)


def _sha(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def weights_digest(model: torch.nn.Module) -> str:
    """Digest of every parameter and buffer: name, dtype, shape and bytes."""
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def tokenizer_digest(model_dir: str | Path) -> str:
    """Digest of the tokenizer and chat-template files in the model's folder (names and bytes)."""
    h = hashlib.sha256()
    folder = Path(model_dir)
    if folder.is_dir():
        for f in sorted(folder.iterdir()):
            if f.is_file() and ("token" in f.name or "template" in f.name or f.name == "special_tokens_map.json"):
                h.update(f.name.encode())
                h.update(f.read_bytes())
    return h.hexdigest()


def code_digest(root: Path = REPO_ROOT) -> str:
    """Digest of the project's Python source (every ``.py`` of :data:`PACKAGES`) and library versions."""
    import transformers

    h = hashlib.sha256(f"torch={torch.__version__};transformers={transformers.__version__}".encode())
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            h.update(str(path.relative_to(root)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def deciding_config(cfg: Any) -> dict[str, Any]:
    """The resolved config without :data:`NOT_DECIDING`."""
    plain = to_plain(cfg)
    for dotted in NOT_DECIDING:
        *parents, leaf = dotted.split(".")
        node = plain
        for key in parents:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(leaf, None)
    return plain


def machine_arithmetic(autocast: str) -> str:
    return f"{platform.machine()}/{torch.backends.cpu.get_cpu_capability()}/autocast={autocast}"


@dataclass(frozen=True)
class ValidationKey:
    """What decides a greedy validation of the starting policy, one digest per part."""

    parts: Mapping[str, str]

    @property
    def digest(self) -> str:
        return _sha(json.dumps(dict(self.parts), sort_keys=True))[:16]

    @classmethod
    def build(cls, *, cfg: Any, model: torch.nn.Module, model_dir: str | Path, task_ids: Iterable[str],
              render_prompt: Callable[[str], list[int]], autocast: str) -> ValidationKey:
        ids = [str(t) for t in task_ids]
        prompts = _sha(json.dumps({t: render_prompt(t) for t in ids}))
        return cls({"weights": weights_digest(model), "tokenizer": tokenizer_digest(model_dir),
                    "tasks": _sha(json.dumps(ids)), "prompts": prompts,
                    "config": _sha(json.dumps(deciding_config(cfg), sort_keys=True, default=str)),
                    "code": code_digest(), "arithmetic": machine_arithmetic(autocast)})


@dataclass(frozen=True)
class CachedValidation:
    """A stored validation: its log (one line per episode) and its metrics."""

    log: Path
    metrics: dict[str, float]


class ValidationCache:
    """``<root>/<key digest>/``: ``validation.jsonl``, ``metrics.json`` and ``key.json`` (the parts)."""

    def __init__(self, root: str | Path | None = None) -> None:
        self.root = Path(root or os.environ.get(DIR_ENV) or DEFAULT_DIR)

    def entry(self, key: ValidationKey) -> Path:
        return self.root / key.digest

    def load(self, key: ValidationKey) -> CachedValidation | None:
        folder = self.entry(key)
        log, metrics = folder / "validation.jsonl", folder / "metrics.json"
        if not (log.is_file() and metrics.is_file()):
            return None
        return CachedValidation(log, {k: float(v) for k, v in json.loads(metrics.read_text()).items()})

    def store(self, key: ValidationKey, log: Path, metrics: Mapping[str, float]) -> Path:
        """Write the entry whole or not at all (a temporary folder renamed into place)."""
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=self.root, prefix=".partial-"))
        try:
            shutil.copyfile(log, tmp / "validation.jsonl")
            (tmp / "metrics.json").write_text(json.dumps(dict(metrics), indent=1, sort_keys=True))
            (tmp / "key.json").write_text(json.dumps(dict(key.parts), indent=1, sort_keys=True))
            target = self.entry(key)
            if target.exists():
                shutil.rmtree(target)
            tmp.rename(target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return target
