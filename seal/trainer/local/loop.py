"""The local trainer (``trainer.backend: local``): one process, CPU or one GPU.

:meth:`LocalTrainer.train_step` reads one GRPO step top to bottom; validation, checkpoints,
metrics and resume hook around it in :meth:`LocalTrainer.fit`.
"""

from __future__ import annotations

import asyncio
import logging
import random
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig

from seal.config_base import ConfigError
from seal.engine.precision import AUTOCAST_DTYPES, log_choice, resolve_autocast
from seal.environment import make_env_client, task_categories
from seal.trainer import RunStopped
from seal.trainer.best_checkpoint import BestCheckpointKeeper, BestCheckpointSettings
from seal.trainer.coevolution import ROLLOUT_MODES, CoEvolution
from seal.trainer.local import checkpoint as ckpt
from seal.trainer.local.data import TaskSampler
from seal.rollout.prompt_length import initial_prompt_renderer, prompt_token_counter
from seal.schema import LocalKeys, block
from seal.trainer.step_rules import episode_metrics, select_trainable, signal_metrics
from seal.trainer.tasks import select_task_ids
from seal.trainer.local.episodes import Episode, EpisodeJob, play_all
from seal.trainer.local.metrics import MetricsLogger
from seal.trainer.local.policy import LossSettings, frozen_copy, load_policy, model_path, resolve_device
from seal.trainer.local.update import build_batch, grpo_advantages_verl, policy_update
from seal.trainer.local.validation import validation_metrics, write_validation_log
from seal.trainer.local.validation_cache import ValidationCache, ValidationKey

logger = logging.getLogger(__name__)

# (cfg, server_manager, tokenizer, env_client) -> an episode runner with verl's AgentLoopBase.run.
RunnerFactory = Callable[[DictConfig, Any, Any, Any], Any]


class EnvFaultError(RunStopped):
    """Too many of a step's episodes hit environment faults; the run stops."""


def default_runner_factory(cfg: DictConfig, server: Any, tokenizer: Any, env_client: Any) -> Any:
    """The project's episode runner (``seal.rollout.agent_loop.SealAgentLoop``)."""
    from seal.rollout.agent_loop import SealAgentLoop

    return SealAgentLoop.for_local(cfg, server, tokenizer, env_client=env_client)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class LocalTrainer:
    """GRPO with the SEAL loop in one process. See :meth:`train_step` for one step."""

    def __init__(self, cfg: DictConfig, exp_dir: Path, *, runner_factory: RunnerFactory | None = None,
                 env_client: Any | None = None, model: Any | None = None, tokenizer: Any | None = None) -> None:
        self.cfg, self.exp_dir = cfg, Path(exp_dir)
        self.local = block(LocalKeys, cfg, "seal.local")
        self.actor = cfg.actor_rollout_ref.actor
        self.rollout_cfg = cfg.actor_rollout_ref.rollout
        self.device = resolve_device(self.local.device)
        seed_everything(int(cfg.data.seed))
        if model is None:
            model, tokenizer = load_policy(cfg, self.device)
        self.model, self.tokenizer = model.to(self.device), tokenizer
        if cfg.actor_rollout_ref.model.get("enable_gradient_checkpointing"):
            # Non-reentrant checkpointing: the reentrant form drops the gradients when the inputs
            # (token ids) do not require grad.
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.loss_settings = LossSettings.from_cfg(self.actor)
        self.ref_model = frozen_copy(self.model) if self.loss_settings.use_kl_loss else None
        self.optimizer = self._make_optimizer()
        self.coevolution = CoEvolution(cfg, self.exp_dir)
        # The runner retries whole episodes (seal.rollout.env_retries); the client does not retry.
        self.env = env_client if env_client is not None else make_env_client(cfg, retries=0)
        self._own_env = env_client is None
        # One precision for generation and the update (seal.engine.precision: auto = bf16 only
        # where the device runs it natively), logged once.
        choice = resolve_autocast(self.local.autocast, self.device)
        log_choice(self.local.autocast, choice, "local trainer (generation and update)")
        self.autocast = choice.setting
        self.server = self._make_server()
        # One event loop for the whole run: the runner and the generation server bind to it.
        self.loop = asyncio.new_event_loop()
        self.runner = self.loop.run_until_complete(self._build_runner(runner_factory or default_runner_factory))
        self.train_ids = select_task_ids(cfg, "train", prompt_tokens=self.prompt_counter(train=True))
        wants_val = bool(cfg.trainer.val_before_train) or int(cfg.trainer.test_freq or 0) > 0
        self.val_ids = select_task_ids(cfg, "val", prompt_tokens=self.prompt_counter(train=False)) if wants_val else []
        # Categories as the environment's task store records them (the interface filters by them).
        self.categories = task_categories(cfg, [*self.train_ids, *self.val_ids])
        self.sampler = TaskSampler(self.train_ids, int(cfg.data.train_batch_size), seed=int(cfg.data.seed),
                                   shuffle=bool(cfg.data.get("shuffle", True)))
        self.total_steps = self._total_steps()
        self.global_step = 0
        # The release's best-validation-step keeping (trainer.save_best_checkpoint).
        self.best = BestCheckpointKeeper(self.checkpoint_root, BestCheckpointSettings.from_trainer_cfg(cfg.trainer))
        self._saved_step: int | None = None
        self.validation_cache = ValidationCache()

    def _make_optimizer(self) -> torch.optim.Optimizer:
        o = self.actor.optim  # AdamW: the config pass's rule for the local trainer (seal.config_values)
        return torch.optim.AdamW(self.model.parameters(), lr=float(o.lr), betas=tuple(float(b) for b in o.betas),
                                 weight_decay=float(o.weight_decay))

    def _make_server(self) -> Any:
        from seal.engine.hf_server import HFServerManager
        from seal.engine.speculative import SpeculativeSettings

        return HFServerManager(self.model, self.tokenizer, max_batch_size=self.local.generation_batch_size,
                               autocast_dtype=AUTOCAST_DTYPES[self.autocast],
                               shared_prefix_min_tokens=self.local.shared_prefix_min_tokens,
                               speculative=SpeculativeSettings(**self.local.speculative))

    async def _build_runner(self, factory: RunnerFactory) -> Any:
        return factory(self.cfg, self.server, self.tokenizer, self.env)

    def _total_steps(self) -> int:
        total = self.cfg.trainer.get("total_training_steps")
        if total:
            return int(total)
        return int(self.cfg.trainer.total_epochs) * self.sampler.steps_per_epoch

    def prompt_counter(self, *, train: bool) -> Callable[[str], int]:
        """``task_id -> tokens of its rendered initial prompt``, as the runner renders it."""
        return prompt_token_counter(self.cfg, self.tokenizer, self.env, rollout_mode=ROLLOUT_MODES[train],
                                    env_params=self.coevolution.env_params(train=train))

    def sampling_params(self, *, train: bool) -> dict[str, Any]:
        """Per-call sampling settings: the rollout's for training, ``val_kwargs`` (greedy) for validation."""
        src = self.rollout_cfg if train else self.rollout_cfg.val_kwargs
        temperature = float(src.temperature)
        greedy = not train and not bool(src.get("do_sample", False))
        # The per-call token budget is the runner's (seal.rollout.max_tokens_per_call).
        return {"temperature": 0.0 if greedy else temperature, "top_p": float(src.top_p),
                "top_k": int(src.get("top_k", -1))}

    def play(self, jobs: Sequence[EpisodeJob], *, train: bool, epoch: int, desc: str,
             sampling: dict[str, Any] | None = None) -> list[Episode]:
        """Play ``jobs`` concurrently through the episode runner (a progress bar per call); the
        runner scores each episode (``epoch`` reaches its reward through ``extra_info``).
        ``sampling``: per-call settings instead of :meth:`sampling_params`'s."""
        coro = play_all(self.runner, jobs, sampling or self.sampling_params(train=train),
                        lambda job: self.coevolution.env_params(train=train, category=job.category),
                        rollout_mode=ROLLOUT_MODES[train], max_concurrency=self.local.max_concurrent_episodes,
                        desc=desc, show_progress=self.local.progress_bars, extra_info={"epoch": epoch})
        return self.loop.run_until_complete(coro)

    def check_faults(self, episodes: Sequence[Episode], step: int) -> None:
        """Stop the run when more than ``seal.local.max_fault_fraction`` of the episodes fault."""
        env = sum(e.env_fault for e in episodes)
        llm = sum(e.llm_fault for e in episodes)
        frac = (env + llm) / max(len(episodes), 1)
        for e in episodes:
            if e.env_fault or e.llm_fault:
                logger.warning("step %d: %s#%d excluded (%s)", step, e.task_id, e.sample, e.result.fault_text())
        limit = self.local.max_fault_fraction
        if frac > limit:
            where = self.cfg.env_service.urls or self.cfg.env_service.url or "in-process"
            raise EnvFaultError(
                f"step {step}: {env + llm} of {len(episodes)} episodes faulted ({env} environment, {llm} LLM), "
                f"more than seal.local.max_fault_fraction={limit}; is the environment service up ({where})? "
                "The last checkpoint is intact: fix the cause and run the same command again to resume.")

    def train_step(self) -> dict[str, float]:
        """One GRPO step with the SEAL loop, top to bottom."""
        t0 = time.time()
        step = self.global_step + 1
        n = int(self.rollout_cfg.n)
        # 1. Tasks for this step, from the seeded per-epoch permutation.
        task_ids, epoch, ends_epoch = self.sampler.next_batch()
        # 2. n sampled episodes per task, training interface on (hints, feedback, guidelines).
        jobs = [EpisodeJob(t, uid=f"{step}:{t}", sample=k, category=self.categories[t])
                for t in task_ids for k in range(n)]
        episodes = self.play(jobs, train=True, epoch=epoch, desc=f"rollout step {step}")
        self.check_faults(episodes, step)
        results = [e.result for e in episodes]
        t_rollout = time.time() - t0
        logger.info("step %d: %d episodes played in %.1f s", step, len(episodes), t_rollout)
        # 3. The capability state observes the training episodes (faulted ones are skipped).
        metrics = self.coevolution.observe(results, epoch=epoch, step=step)
        metrics.update(episode_metrics(results))
        # 4. GRPO advantages over the trainable episodes (seal.advantage.grpo, as on verl).
        # The shared step rules: faulted, excluded and lone-survivor episodes are left out.
        selection = select_trainable([not e.trainable for e in episodes], [e.uid for e in episodes], n=n)
        metrics.update(selection.metrics())
        metrics.update(signal_metrics([r.reward for r in results], [e.uid for e in episodes], selection.trainable))
        kept = [e for e, keep in zip(episodes, selection.trainable) if keep]
        if kept:
            batch = build_batch(kept)
            adv = grpo_advantages_verl(batch, norm_by_std=bool(self.cfg.algorithm.norm_adv_by_std_in_grpo))
            # 5. A-Patch: dynamic tag weights from the state, then per-episode scales.
            tags = [list(e.tags) for e in kept]
            adv, apatch_metrics = self.coevolution.reweight(adv, tags, step=step)
            metrics.update(apatch_metrics)
            adv, credit_metrics = self.coevolution.credit_turns(adv, batch.mask, [e.result.call_turns for e in kept],
                                                                tags)
            metrics.update(credit_metrics)
            # 6. PPO-clip + low_var_kl update, grad clip, AdamW. The clip is the optimizer's
            # clip_grad, the key verl's FSDP engine reads (it does not read actor.grad_clip).
            logger.info("step %d: updating on %d episodes (%d tokens)", step, len(kept),
                        sum(len(e.prompt_ids) + len(e.response_ids) for e in kept))
            metrics.update(policy_update(
                self.model, self.ref_model, self.optimizer, batch, adv, self.loss_settings,
                device=self.device, autocast=self.autocast,
                mini_batch_rows=int(self.actor.ppo_mini_batch_size) * n, ppo_epochs=int(self.actor.ppo_epochs),
                grad_clip=float(self.actor.optim.clip_grad), shared_prefix=self.local.shared_prefix_training))
        else:
            logger.warning("step %d: no episode left to train on (%d excluded, %d lone survivors); the update "
                           "is skipped", step, selection.excluded, selection.lone_survivors)
        # 7. Bookkeeping: the step counter, the epoch boundary, SEAL's state metrics.
        self.global_step = step
        self.coevolution.after_step(epoch, step, ends_epoch=ends_epoch, last_step=step >= self.total_steps)
        metrics.update(self.coevolution.step_metrics())
        metrics.update({"training/epoch": float(epoch), "timing/rollout_s": t_rollout,
                        "timing/update_s": time.time() - t0 - t_rollout, "timing/step_s": time.time() - t0})
        return metrics

    def validate(self, step: int) -> dict[str, float]:
        """Greedy, one episode per validation task, untouched interface; writes the step's log.
        Then, with ``seal.local.sampled_validation_n``, that many sampled episodes per task.
        A fresh run's step-0 greedy pass is read from the validation cache when its key matches
        (:mod:`seal.trainer.local.validation_cache`)."""
        t0 = time.time()
        key = self.start_validation_key() if step == 0 and self.global_step == 0 else None
        cached = self.validation_cache.load(key) if key is not None else None
        log_dir = self.exp_dir / "validation_log"
        if cached is not None:
            log_dir.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(cached.log, log_dir / "0.jsonl")
            metrics = dict(cached.metrics)
            logger.info("validation at step 0: read from the validation cache (%s, key %s)",
                        self.validation_cache.entry(key), key.digest)
        else:
            jobs = [EpisodeJob(t, uid=t, sample=0, category=self.categories[t]) for t in self.val_ids]
            episodes = self.play(jobs, train=False, epoch=self.sampler.pos.epoch, desc=f"validation step {step}")
            logger.info("validation at step %d: %d episodes in %.1f s", step, len(episodes), time.time() - t0)
            log = write_validation_log(log_dir, step, episodes, self.sampling_params(train=False), split="val")
            metrics = validation_metrics(episodes)
            if key is not None:
                self.validation_cache.store(key, log, metrics)
        metrics["val/from_cache"] = float(cached is not None)
        if self.local.sampled_validation_n > 0:
            metrics.update(self.validate_sampled(step))
        return metrics | {"timing/validation_s": time.time() - t0}

    def start_validation_key(self) -> ValidationKey | None:
        """The cache key of this run's step-0 greedy validation; ``None`` when the cache is off."""
        if not self.local.validation_cache:
            return None
        render = initial_prompt_renderer(self.cfg, self.tokenizer, self.env, rollout_mode=ROLLOUT_MODES[False],
                                         env_params=self.coevolution.env_params(train=False))
        return ValidationKey.build(cfg=self.cfg, model=self.model, model_dir=model_path(self.cfg),
                                   task_ids=self.val_ids, render_prompt=render, autocast=self.autocast)

    def validate_sampled(self, step: int) -> dict[str, float]:
        """``n`` episodes per validation task at ``sampled_validation_temperature``, validation
        interface; ``val_sampled/*`` metrics and ``validation_log_sampled/<step>.jsonl``."""
        n = self.local.sampled_validation_n
        jobs = [EpisodeJob(t, uid=t, sample=k, category=self.categories[t]) for t in self.val_ids for k in range(n)]
        params = {"temperature": float(self.local.sampled_validation_temperature), "top_p": 1.0, "top_k": -1}
        episodes = self.play(jobs, train=False, epoch=self.sampler.pos.epoch, desc=f"sampled validation step {step}",
                             sampling=params)
        write_validation_log(self.exp_dir / "validation_log_sampled", step, episodes, params, split="val")
        return {k.replace("val/", "val_sampled/", 1): v for k, v in validation_metrics(episodes).items()}

    def trainer_state(self) -> dict[str, Any]:
        return {"global_step": self.global_step, "data": self.sampler.state_dict()}

    def save(self) -> None:
        """Checkpoint this step (once per step); with keep-only-best, drop the folders that are
        neither the best step's nor this newest one."""
        if self._saved_step == self.global_step:
            return
        keep = self.cfg.trainer.get("max_actor_ckpt_to_keep")
        ckpt.save_checkpoint(self.checkpoint_root, self.global_step, model=self.model, optimizer=self.optimizer,
                             trainer_state=self.trainer_state(), coevolution=self.coevolution, keep=int(keep) if keep else None)
        self._saved_step = self.global_step
        self.best.prune()

    def validate_and_keep_best(self, step: int) -> dict[str, float]:
        """:meth:`validate`, then the best-step check: a new best step is checkpointed and marked."""
        metrics = self.validate(step)
        metrics.update(self.best.after_validation(step, metrics, self.save))
        return metrics

    @property
    def checkpoint_root(self) -> Path:
        return self.exp_dir / "checkpoints"

    def maybe_resume(self) -> bool:
        """Apply ``trainer.resume_mode`` (verl's: ``auto`` / ``disable`` / ``resume_path``)."""
        mode = str(self.cfg.trainer.resume_mode)
        if mode == "disable":
            if ckpt.latest_checkpoint(self.checkpoint_root) is not None:
                logger.warning("trainer.resume_mode=disable: starting over; checkpoints in %s will be overwritten",
                               self.checkpoint_root)
            return False
        if mode == "auto":
            path = ckpt.latest_checkpoint(self.checkpoint_root)
            if path is None:
                return False
        elif mode == "resume_path":
            if not self.cfg.trainer.resume_from_path:
                raise ConfigError("trainer.resume_mode=resume_path needs trainer.resume_from_path")
            path = Path(str(self.cfg.trainer.resume_from_path))
        else:
            raise ConfigError(f"trainer.resume_mode={mode}: choose auto, disable or resume_path")
        state = ckpt.load_checkpoint(path, model=self.model, optimizer=self.optimizer, coevolution=self.coevolution)
        self.global_step = int(state["global_step"])
        self._saved_step = self.global_step
        self.sampler.load_state_dict(state["data"])
        self.best.restore()
        logger.info("resumed from %s (step %d, epoch %d, index %d)", path, self.global_step,
                    self.sampler.pos.epoch, self.sampler.pos.index)
        return True

    def fit(self) -> None:
        """Validation before training, the steps, periodic validation and checkpoints."""
        t = self.cfg.trainer
        resumed = self.maybe_resume()
        log = MetricsLogger(self.exp_dir, resume_step=self.global_step if resumed else None,
                            tensorboard=self.local.tensorboard)
        try:
            if not resumed and t.val_before_train and self.val_ids:
                log.log(0, self.validate_and_keep_best(0))
            save_freq, test_freq = int(t.save_freq or 0), int(t.test_freq or 0)
            while self.global_step < self.total_steps:
                metrics = self.train_step()
                last = self.global_step == self.total_steps
                if test_freq > 0 and (self.global_step % test_freq == 0 or last):
                    metrics.update(self.validate_and_keep_best(self.global_step))
                log.log(self.global_step, metrics)
                if (save_freq > 0 and self.global_step % save_freq == 0) or last:
                    self.save()
        finally:
            log.close()

    def close(self) -> None:
        self.server.close()
        self.loop.close()
        if self._own_env:
            self.env.close()


def run_local(cfg: DictConfig, *, exp_dir: Path, runner_factory: RunnerFactory | None = None,
              env_client: Any | None = None) -> None:
    """Train with the local backend; outputs go to ``exp_dir`` (listed in docs/quickstart.md)."""
    trainer = LocalTrainer(cfg, exp_dir, runner_factory=runner_factory, env_client=env_client)
    try:
        trainer.fit()
    finally:
        trainer.close()
