"""``SealRayPPOTrainer``: verl's ``RayPPOTrainer`` with SEAL's step logic in one hook.

verl's ``fit()`` is used as is. ``compute_advantage`` is a module function, so the first trainer
method that sees the GRPO advantages before the policy update is ``_update_actor``; SEAL overrides
it to observe the step's episodes, rescale ``batch.batch["advantages"]`` with the reweighter and
return ``seal/*`` metrics, which ``fit()`` logs. The step rules are applied once, by the first of
``_compute_old_log_prob`` / ``_compute_ref_log_prob`` to run (:func:`seal.trainer.verl.batch.select_rows`);
the advantages are the SEAL estimator ``seal_grpo`` (:mod:`seal.advantage.grpo`). The other overrides
(checkpoints with the diagnosis state, each row's environment params, the validation log, the
best validation step after ``_validate``) each call verl's; docs/architecture.md lists them.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, open_dict

from seal.advantage.grpo import SEAL_GRPO
from seal.config_base import ConfigError
from seal.config_values import check_verl_backend
from seal.eval.logs import ValidationLogWriter
from seal.trainer.best_checkpoint import BestCheckpointKeeper, BestCheckpointSettings
from seal.trainer.coevolution import CoEvolution
from seal.trainer.step_rules import episode_metrics
from seal.trainer.verl.batch import select_rows
from seal.trainer.verl.validation import RECORD_KEY, validation_records
from verl import DataProto
from verl.trainer.ppo.ray_trainer import RayPPOTrainer

logger = logging.getLogger(__name__)

SEAL_CKPT_DIR = "seal"


def check_verl_config(config: DictConfig) -> None:
    """Reject verl settings under which the SEAL hook would not run every step (the config pass's
    rule, :func:`seal.config_values.check_verl_backend`, checked again where the trainer starts)."""
    check_verl_backend(config)


def use_seal_grpo(config: DictConfig) -> None:
    """Run ``algorithm.adv_estimator=grpo`` as ``seal_grpo`` (in place, logged): verl computes its
    built-in ``grpo`` inline, before its estimator registry, with the left-out rows in the baselines."""
    if str(config.algorithm.adv_estimator) == "grpo":
        with open_dict(config):
            config.algorithm.adv_estimator = SEAL_GRPO
        logger.info("algorithm.adv_estimator=grpo runs as %s: GRPO with the episodes the step rules leave out "
                    "kept out of the group baselines", SEAL_GRPO)


class SealRayPPOTrainer(RayPPOTrainer):
    """verl's PPO trainer plus the SEAL hooks (see the module docstring for which and why).

    Args:
        config: the composed experiment config (verl's tree plus the SEAL blocks).
        *args, **kwargs: passed to ``RayPPOTrainer`` unchanged.
        exp_dir: ``experiments/<experiment_name>`` (absolute), where the capability state and
            the epoch stats are written.
    """

    def __init__(self, config: DictConfig, *args: Any, exp_dir: Path, **kwargs: Any) -> None:
        check_verl_config(config)
        use_seal_grpo(config)
        super().__init__(config, *args, **kwargs)
        self.coevolution = CoEvolution(config, Path(exp_dir))
        self._best_checkpoints()  # a bad best-checkpoint setting fails here, not after the first validation

    def _update_actor(self, batch: DataProto) -> DataProto:
        """SEAL's step (observe, A-Patch on ``advantages``), then verl's actor update.

        ``batch`` is ``fit()``'s batch after ``compute_advantage``: ``advantages`` and
        ``response_mask`` are ``(B, T)``, one row per episode. It is changed in place, so the
        data metrics ``fit()`` logs afterwards show the advantages the actor trained on. When
        no response token is left to train on (every episode left out by the step rules, or
        rejected by verl's rollout correction) the actor update is skipped, not sent to the
        workers: verl's loss needs at least one valid token.
        """
        seal_metrics = self.seal_step(batch)
        if not bool(batch.batch["response_mask"].any()):
            logger.warning("step %d: no episode left to train on (%d of %d excluded, %d lone survivors); "
                           "the actor update is skipped", self.global_steps, int(seal_metrics["seal/excluded_episodes"]),
                           len(batch), int(seal_metrics["seal/lone_survivors"]))
            seal_metrics["seal/skipped_updates"] = 1.0
            return DataProto.from_single_dict(data={}, meta_info={"metrics": seal_metrics})
        output = super()._update_actor(batch)
        output.meta_info.setdefault("metrics", {}).update(seal_metrics)
        return output

    def seal_step(self, batch: DataProto) -> dict[str, float]:
        """Steps (a)–(c) of the module docstring on ``batch`` (plus the epoch-end dump); returns
        the ``seal/*`` metrics. The records and the step rules' selection are the ones the first
        hook of the step stored (:meth:`_any_token_to_train`)."""
        step = int(self.global_steps)
        steps_per_epoch = len(self.train_dataloader)
        epoch = (step - 1) // steps_per_epoch
        results, selection = select_rows(batch, n=int(self.config.actor_rollout_ref.rollout.n))
        # Excluded episodes say nothing about the policy: the capability state never sees them.
        metrics = dict(self.coevolution.observe(results, epoch=epoch, step=step))
        adv = batch.batch["advantages"]
        tags = [list(r.tags) if keep else None for r, keep in zip(results, selection.trainable)]
        new_adv, reweight_metrics = self.coevolution.reweight(adv, tags, step=step)
        mask = batch.batch["response_mask"].to(new_adv.device)
        new_adv, credit_metrics = self.coevolution.credit_turns(new_adv, mask, [r.call_turns for r in results], tags)
        batch.batch["advantages"] = new_adv.to(device=adv.device, dtype=adv.dtype)
        metrics.update(reweight_metrics)
        metrics.update(credit_metrics)
        metrics.update(episode_metrics(results))
        metrics.update(selection.metrics())
        self.coevolution.after_step(epoch, step, ends_epoch=step % steps_per_epoch == 0,
                                   last_step=step >= self.total_training_steps)
        metrics.update(self.coevolution.step_metrics())
        return metrics

    def _compute_old_log_prob(self, batch: DataProto) -> tuple[DataProto, float]:
        """verl's old-policy log-probs, after the step rules zeroed the left-out rows' masks.

        When nothing is left to train on, no worker is called: zero log-probs come back and the
        batch's ``rollout_log_probs`` are dropped, so verl's rollout correction (which needs at
        least one valid token) is skipped for a step whose update is skipped anyway.
        """
        if not self._any_token_to_train(batch):
            if "rollout_log_probs" in batch.batch.keys():
                batch.pop(batch_keys=["rollout_log_probs"])
            zeros = torch.zeros_like(batch.batch["response_mask"], dtype=torch.float32)
            return DataProto.from_single_dict({"old_log_probs": zeros, "entropys": zeros.clone()}), 0.0
        return super()._compute_old_log_prob(batch)

    def _compute_ref_log_prob(self, batch: DataProto) -> DataProto:
        """verl's reference log-probs; zeros without a worker call when nothing is left to train on."""
        if not self._any_token_to_train(batch):
            zeros = torch.zeros_like(batch.batch["response_mask"], dtype=torch.float32)
            return DataProto.from_single_dict({"ref_log_prob": zeros})
        return super()._compute_ref_log_prob(batch)

    def _any_token_to_train(self, batch: DataProto) -> bool:
        """Apply the step rules (at the step's first call: :func:`select_rows` zeroes the
        left-out rows' masks); return whether any response token is left to train on."""
        select_rows(batch, n=int(self.config.actor_rollout_ref.rollout.n))
        return bool(batch.batch["response_mask"].any())

    def _get_gen_batch(self, batch: DataProto) -> DataProto:
        """verl's generation batch plus what the episode runner reads beyond the task id.

        Each row gets ``env_params`` from :meth:`CoEvolution.env_params` for its ``rollout_mode``
        (``sample`` for training rows, ``validate`` for validation rows) and category; training
        rows also get the current epoch in ``extra_info["epoch"]`` (the reward's cap decay).
        """
        gen_batch = super()._get_gen_batch(batch)
        ntb = gen_batch.non_tensor_batch
        if "rollout_mode" not in ntb:
            return gen_batch
        categories = ntb.get("data_source", [None] * len(gen_batch))
        infos = ntb.get("extra_info", [None] * len(gen_batch))
        epoch = (int(self.global_steps) - 1) // max(1, len(self.train_dataloader))
        cache: dict[tuple[str, Any], dict[str, Any]] = {}
        params = np.empty(len(gen_batch), dtype=object)
        for i, (mode, cat) in enumerate(zip(ntb["rollout_mode"], categories)):
            key = (str(mode), cat)
            if key not in cache:
                cache[key] = self.coevolution.env_params(train=key[0] == "sample", category=cat)
            params[i] = cache[key]
            if key[0] == "sample" and isinstance(infos[i], dict):
                # The same dict object sits in the training batch, so both stay consistent.
                infos[i]["epoch"] = max(0, epoch)
        ntb["env_params"] = params
        return gen_batch

    def _dump_generations(self, inputs: list[str], outputs: list[str], gts: list[Any], scores: list[float],
                          reward_extra_infos_dict: dict[str, list[Any]], dump_path: str) -> None:
        """Write ``<dump_path>/<step>.jsonl`` in the project's validation-log format (:mod:`seal.eval.logs`).

        verl calls this with ``trainer.validation_data_dir`` after each validation (and with
        ``trainer.rollout_data_dir`` after each training step, when set). When the episode runner
        supplied its ``seal_record`` column the lines are :class:`seal.eval.logs.ValidationRecord`
        objects; otherwise verl's own dump is written.
        """
        records = reward_extra_infos_dict.get(RECORD_KEY)
        if records is None or len(records) != len(scores):
            super()._dump_generations(inputs, outputs, gts, scores, reward_extra_infos_dict, dump_path)
            return
        val = self.config.actor_rollout_ref.rollout.val_kwargs
        generation = {"temperature": float(val.temperature), "top_p": float(val.top_p), "top_k": int(val.top_k),
                      "do_sample": bool(val.do_sample), "n": int(val.n),
                      "response_length": int(self.config.actor_rollout_ref.rollout.response_length)}
        writer = ValidationLogWriter(dump_path)
        path = writer.path_for(self.global_steps)
        path.unlink(missing_ok=True)  # a re-run of the same step replaces its log
        writer.write_many(validation_records(list(records), scores, step=self.global_steps, generation=generation))
        logger.info("validation log: %d episodes in %s", len(scores), path)

    def _step_folder(self, step: int) -> Path:
        return Path(os.path.abspath(str(self.config.trainer.default_local_dir))) / f"global_step_{step}"

    def _save_checkpoint(self) -> None:
        """Write the diagnosis state into ``global_step_<n>/seal/``, then verl's checkpoint.

        The state goes first: verl writes ``latest_checkpointed_iteration.txt`` last, so a
        checkpoint verl can resume from always holds the matching diagnosis state. With
        ``trainer.keep_only_best_checkpoint`` the folders other than the best and this newest
        one are then deleted.
        """
        self.coevolution.save(self._step_folder(self.global_steps) / SEAL_CKPT_DIR)
        super()._save_checkpoint()
        self._saved_step = int(self.global_steps)
        self._best_checkpoints().prune()

    def _validate(self, merged: bool = False) -> dict[str, Any]:
        """verl's validation pass, then the best-step check on its scores: a new best step is
        checkpointed (unless verl saved this step already) and marked; ``best_checkpoint/*``
        metrics join the validation metrics verl logs."""
        metrics = super()._validate(merged=merged)
        keeper = self._best_checkpoints()
        if keeper.enabled and metrics:
            metrics.update(keeper.after_validation(int(self.global_steps), metrics, self._save_best_step))
        return metrics

    def _save_best_step(self) -> None:
        if getattr(self, "_saved_step", None) != int(self.global_steps):
            self._save_checkpoint()

    def _best_checkpoints(self) -> BestCheckpointKeeper:
        keeper = getattr(self, "_best_keeper", None)
        if keeper is None:
            root = Path(os.path.abspath(str(self.config.trainer.default_local_dir)))
            keeper = BestCheckpointKeeper(root, BestCheckpointSettings.from_trainer_cfg(self.config.trainer))
            self._best_keeper = keeper
        return keeper

    def _load_checkpoint(self) -> Any:
        """verl's resume, then the diagnosis state saved with the same checkpoint (and the best
        validation step so far, when best-step keeping is on)."""
        result = super()._load_checkpoint()
        self._best_checkpoints().restore()
        folder = self._resumed_folder()
        if folder is not None:
            self._saved_step = int(self.global_steps)  # its folder exists: a best here needs no new save
            seal_dir = folder / SEAL_CKPT_DIR
            if not seal_dir.is_dir():
                raise ConfigError(
                    f"checkpoint {folder} has no {SEAL_CKPT_DIR}/ folder (not written by this trainer); "
                    "start from scratch with trainer.resume_mode=disable")
            self.coevolution.load(seal_dir)
            logger.info("restored the SEAL diagnosis state from %s", seal_dir)
        return result

    def _resumed_folder(self) -> Path | None:
        """The ``global_step_<n>`` folder verl's ``_load_checkpoint`` resumed from, if any."""
        mode = str(self.config.trainer.resume_mode)
        if mode == "disable" or int(getattr(self, "global_steps", 0)) == 0:
            return None
        if mode == "resume_path":
            return Path(os.path.abspath(str(self.config.trainer.resume_from_path)))
        return self._step_folder(int(self.global_steps))

