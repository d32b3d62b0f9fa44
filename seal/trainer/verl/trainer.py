"""``SealPPOTrainer``: verl's V1 sync trainer (``PPOTrainerSync``) with SEAL's step in its seams.

verl's ``fit()`` and ``_step_once()`` run unchanged. A step's batch lives in TransferQueue
(:mod:`seal.trainer.verl.batch`); SEAL adds, each time calling verl's own method:

* ``_balance_batch`` (after verl pads and reorders, before any log-prob): the step rules read
  every real episode's record once and zero the left-out rows' loss masks; padding rows are never
  counted;
* ``_compute_old_log_prob`` / ``_compute_ref_log_prob`` / ``_compute_advantage``: zeros and no
  worker call when nothing is left to train on;
* ``_update_actor``: observe the episodes, A-Patch (and per-turn credit) on the GRPO advantages,
  then verl's actor update, or none when nothing is left to train on;
* ``fit``: the agent-loop manager wrapped so that every dispatched row, training or validation,
  carries its environment params (:class:`EpisodeParamsDispatch`);
* ``_save_checkpoint`` / ``_load_checkpoint``: the SEAL state inside each ``global_step_<n>``;
  ``_validate``: the best validation step; ``_dump_generations``: the project's validation log;
* ``_init_dataloader`` / ``_init_resource_pool_mgr``: the task dataset, and verl's CPU workers and
  pools when running on the CPU platform (:mod:`seal.trainer.verl.cpu`).

The advantages are the SEAL estimator ``seal_grpo`` (:mod:`seal.advantage.grpo`), reached through
verl's estimator registry. docs/gpu.md lists these seams and the test that pins each.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import transfer_queue as tq
from omegaconf import DictConfig, open_dict
from tensordict import TensorDict
from torchdata.stateful_dataloader import StatefulDataLoader
from verl.trainer.ppo.utils import create_rl_sampler
from verl.trainer.ppo.v1 import PPOTrainerSync
from verl.utils import tensordict_utils as tu
from verl.utils.dataset.rl_dataset import collate_fn
from verl.workers.utils.padding import response_to_nested

from seal.advantage.grpo import SEAL_GRPO
from seal.config_base import ConfigError
from seal.config_values import check_verl_backend
from seal.eval.logs import ValidationLogWriter
from seal.trainer.best_checkpoint import BestCheckpointKeeper, BestCheckpointSettings
from seal.trainer.coevolution import CoEvolution
from seal.trainer.step_rules import episode_metrics
from seal.trainer.verl.batch import StepEpisodes, nested_zeros_like, read_step, zero_masks
from seal.trainer.verl.validation import RECORD_KEY, validation_records

logger = logging.getLogger(__name__)

SEAL_CKPT_DIR = "seal"


def check_verl_config(config: DictConfig) -> None:
    """Reject verl settings under which the SEAL step would not run every step (the config pass's
    rule, :func:`seal.config_values.check_verl_backend`, checked again where the trainer starts)."""
    check_verl_backend(config)


def use_seal_grpo(config: DictConfig) -> None:
    """Run ``algorithm.adv_estimator=grpo`` as ``seal_grpo`` (in place, logged): verl's built-in
    ``grpo`` keeps the rows the step rules leave out in the group baselines."""
    if str(config.algorithm.adv_estimator) == "grpo":
        with open_dict(config):
            config.algorithm.adv_estimator = SEAL_GRPO
        logger.info("algorithm.adv_estimator=grpo runs as %s: GRPO with the episodes the step rules leave out "
                    "kept out of the group baselines", SEAL_GRPO)


class EpisodeParamsDispatch:
    """verl's agent-loop manager, with each dispatched row's environment params added.

    Every batch verl dispatches (training prompts in ``prepare_step``, validation batches in
    ``_validate``) goes through ``generate_sequences``; rows get ``env_params`` from
    :meth:`CoEvolution.env_params` for their mode and category, training rows also the epoch in
    ``extra_info["epoch"]`` (the reward's cap decay). Everything else is the manager's own.
    """

    def __init__(self, manager: Any, trainer: SealPPOTrainer) -> None:
        self._manager = manager
        self._trainer = trainer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._manager, name)

    def generate_sequences(self, batch: TensorDict) -> None:
        validate = bool(tu.get_non_tensor_data(batch, "validate", False))
        categories = list(batch["data_source"]) if "data_source" in batch.keys() else [None] * len(batch)
        cache: dict[Any, dict[str, Any]] = {}
        params = []
        for category in categories:
            if category not in cache:
                cache[category] = self._trainer.coevolution.env_params(train=not validate, category=category)
            params.append(cache[category])
        tu.assign_non_tensor_stack(batch, "env_params", params)
        if not validate and "extra_info" in batch.keys():
            epoch = self._trainer.epoch_of(int(self._trainer.global_steps))
            infos = [{**(info if isinstance(info, dict) else {}), "epoch": epoch} for info in batch["extra_info"]]
            tu.assign_non_tensor_stack(batch, "extra_info", infos)
        return self._manager.generate_sequences(batch)


class SealPPOTrainer(PPOTrainerSync):
    """verl's V1 sync trainer plus the SEAL seams (see the module docstring for which and why).

    Args:
        config: the composed experiment config (verl's tree plus the SEAL blocks).
        exp_dir: ``experiments/<experiment_name>`` (absolute), where the capability state and
            the epoch stats are written.
    """

    def __init__(self, config: DictConfig, *, exp_dir: Path) -> None:
        check_verl_config(config)
        use_seal_grpo(config)
        super().__init__(config)
        self.coevolution = CoEvolution(config, Path(exp_dir))
        self._step: StepEpisodes | None = None
        self._best_checkpoints()  # a bad best-checkpoint setting fails here, not after the first validation

    # ---- construction ----------------------------------------------------------------------

    def _init_dataloader(self) -> None:
        """verl's loaders over :class:`~seal.trainer.verl.dataset.TaskDataset` rows (task ids,
        after the ``seal.tasks`` filters and the real prompt-length check) in place of verl's
        prompt dataset; the epoch length and step count follow verl's rules."""
        from seal.trainer.verl.dataset import TaskDataset

        data = self.config.data
        self.train_dataset = TaskDataset.from_config(self.config, "train", tokenizer=self.tokenizer)
        self.val_dataset = TaskDataset.from_config(self.config, "val", tokenizer=self.tokenizer)
        self.train_dataloader = StatefulDataLoader(
            dataset=self.train_dataset, batch_size=data.get("gen_batch_size", None) or data.train_batch_size,
            num_workers=data["dataloader_num_workers"], drop_last=True, collate_fn=collate_fn,
            sampler=create_rl_sampler(data, self.train_dataset))
        self.train_dataloader_it = None
        self.val_dataloader = StatefulDataLoader(
            dataset=self.val_dataset, batch_size=data.val_batch_size or len(self.val_dataset),
            num_workers=data["dataloader_num_workers"], shuffle=data.get("validation_shuffle", True),
            drop_last=False, collate_fn=collate_fn)
        self.steps_per_epoch = len(self.train_dataset) // data.train_batch_size
        total = self.config.trainer.total_training_steps
        self.total_training_steps = int(total) if total is not None else \
            self.steps_per_epoch * int(self.config.trainer.total_epochs)
        with open_dict(self.config):  # the LR schedule's horizon, as verl sets it
            self.config.actor_rollout_ref.actor.optim.total_training_steps = \
                self.total_training_steps * self.parameter_sync_step
        logger.info("tasks: %d train, %d val; %d steps (%d a epoch)", len(self.train_dataset),
                    len(self.val_dataset), self.total_training_steps, self.steps_per_epoch)

    def _init_resource_pool_mgr(self) -> None:
        """verl's roles and pools; on the CPU platform, the gloo worker and pools of Ray CPUs."""
        super()._init_resource_pool_mgr()
        from seal.trainer.verl import cpu

        if cpu.platform_selected():
            import ray

            for role in list(self.role_worker_mapping):
                self.role_worker_mapping[role] = ray.remote(cpu.CpuActorRolloutRefWorker)
            manager = self.resource_pool_manager
            # One process a slot: the FSDP worker holds actor, reference and rollout together.
            self.resource_pool_manager = cpu.resource_pool_manager_class()(
                resource_pool_spec=manager.resource_pool_spec, mapping=manager.mapping, max_colocate_count=1)

    def fit(self, agent_loop_manager: Any) -> None:
        super().fit(EpisodeParamsDispatch(agent_loop_manager, self))

    def epoch_of(self, step: int) -> int:
        return max(0, (step - 1) // max(1, int(self.steps_per_epoch)))

    # ---- the step ----------------------------------------------------------------------------

    def _balance_batch(self, batch: Any, metrics: dict, logging_prefix: str = "global_seqlen",
                       keep_minibatch: bool = False) -> Any:
        """verl's padding and reordering, then the step rules, once: the real rows' records, and
        the loss masks of the rows left out zeroed before any log-prob or loss reads them."""
        batch = super()._balance_batch(batch, metrics, logging_prefix=logging_prefix, keep_minibatch=keep_minibatch)
        self._step = read_step(batch, n=int(self.config.actor_rollout_ref.rollout.n))
        zero_masks(batch, self._step)
        return batch

    def _nothing_to_train(self) -> bool:
        return self._step is not None and self._step.selection.nothing_to_train

    def _put_zeros(self, batch: Any, *fields: str) -> Any:
        zeros = nested_zeros_like(batch)
        return tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id,
                               fields=TensorDict({f: zeros.clone() for f in fields}, batch_size=len(batch)))

    def _compute_old_log_prob(self, batch: Any, metrics: dict) -> Any:
        """verl's old-policy log-probs; zeros without a worker call when nothing is left to train on."""
        if self._nothing_to_train():
            return self._put_zeros(batch, "old_log_probs", "entropy")
        return super()._compute_old_log_prob(batch, metrics)

    def _compute_ref_log_prob(self, batch: Any, metrics: dict) -> Any:
        """verl's reference log-probs; zeros without a worker call when nothing is left to train on."""
        if self._nothing_to_train():
            return self._put_zeros(batch, "ref_log_prob")
        return super()._compute_ref_log_prob(batch, metrics)

    def _compute_advantage(self, batch: Any, metrics: dict) -> Any:
        """verl's advantages (the ``seal_grpo`` estimator); zeros when nothing is left to train on
        (verl's rollout correction needs at least one valid token)."""
        if self._nothing_to_train():
            return self._put_zeros(batch, "advantages", "returns")
        return super()._compute_advantage(batch, metrics)

    def _update_actor(self, batch: Any, metrics: dict) -> Any:
        """SEAL's step (observe, A-Patch and turn credit on ``advantages``), then verl's actor
        update; skipped, not sent to the workers, when no episode is left to train on."""
        step = self._step.aligned_to(batch.keys) if self._step is not None else read_step(
            batch, n=int(self.config.actor_rollout_ref.rollout.n))
        seal_metrics = self.seal_step(batch, step)
        metrics.update(seal_metrics)
        if step.selection.nothing_to_train:
            logger.warning("step %d: no episode left to train on (%d of %d excluded, %d lone survivors); "
                           "the actor update is skipped", self.global_steps, step.selection.excluded,
                           len(step.episodes), step.selection.lone_survivors)
            return batch
        return super()._update_actor(batch, metrics)

    def seal_step(self, batch: Any, step: StepEpisodes) -> dict[str, float]:
        """Observe the step's episodes, reweight the GRPO advantages in TransferQueue, and run the
        end-of-step work (epoch dump, interface evolution); returns the ``seal/*`` metrics."""
        number = int(self.global_steps)
        epoch = self.epoch_of(number)
        episodes = step.episodes
        # Excluded episodes say nothing about the policy: the capability state never sees them.
        metrics = dict(self.coevolution.observe(episodes, epoch=epoch, step=number))
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                               select_fields=["advantages", "response_mask"])
        nested_mask = data["response_mask"]
        adv = data["advantages"].to_padded_tensor(0.0)
        mask = nested_mask.to_padded_tensor(0)
        tags = step.row_tags()
        new_adv, reweight_metrics = self.coevolution.reweight(adv, tags, step=number)
        new_adv, credit_metrics = self.coevolution.credit_turns(new_adv, mask, step.row_call_turns(), tags)
        advantages = response_to_nested(new_adv.to(adv.dtype), nested_mask)
        tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id,
                        fields=TensorDict({"advantages": advantages}, batch_size=len(batch)))
        metrics.update(reweight_metrics)
        metrics.update(credit_metrics)
        metrics.update(episode_metrics(episodes))
        metrics.update(step.selection.metrics())
        metrics.update(step.signal_metrics())
        metrics["seal/nonzero_advantage_rows"] = float(((new_adv != 0) & (mask > 0)).any(dim=-1).sum())
        self.coevolution.after_step(epoch, number, ends_epoch=number % max(1, self.steps_per_epoch) == 0,
                                    last_step=number >= self.total_training_steps)
        metrics.update(self.coevolution.step_metrics())
        return metrics

    # ---- validation and outputs -------------------------------------------------------------

    def _dump_generations(self, inputs: list[str], outputs: list[str], gts: list[Any], scores: list[float],
                          reward_extra_infos_dict: dict[str, list[Any]], dump_path: str) -> None:
        """Write ``<dump_path>/<step>.jsonl`` in the project's validation-log format
        (:mod:`seal.eval.logs`) when the episodes carry their SEAL record; else verl's own dump."""
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

    def _validate(self) -> dict[str, Any]:
        """verl's validation pass, then the best-step check on its scores: a new best step is
        checkpointed (unless this step was saved already) and marked; ``best_checkpoint/*``
        metrics join the validation metrics."""
        metrics = super()._validate()
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
            keeper = BestCheckpointKeeper(self._checkpoint_root(), BestCheckpointSettings.from_trainer_cfg(self.config.trainer))
            self._best_keeper = keeper
        return keeper

    # ---- checkpoints ------------------------------------------------------------------------

    def _checkpoint_root(self) -> Path:
        return Path(os.path.abspath(str(self.config.trainer.default_local_dir)))

    def _save_checkpoint(self) -> None:
        """The SEAL state into ``global_step_<n>/seal/``, then verl's checkpoint: verl writes its
        tracker last, so a checkpoint verl resumes from always holds the matching SEAL state. With
        ``trainer.keep_only_best_checkpoint`` the folders but the best and this one are deleted."""
        self.coevolution.save(self._checkpoint_root() / f"global_step_{self.global_steps}" / SEAL_CKPT_DIR)
        super()._save_checkpoint()
        self._saved_step = int(self.global_steps)
        self._best_checkpoints().prune()

    def _load_checkpoint(self) -> None:
        """verl's resume, then the SEAL state saved with the same checkpoint (and the best
        validation step so far, when best-step keeping is on)."""
        super()._load_checkpoint()
        self._best_checkpoints().restore()
        folder = self._resumed_folder()
        if folder is None:
            return
        self._saved_step = int(self.global_steps)  # its folder exists: a best here needs no new save
        seal_dir = folder / SEAL_CKPT_DIR
        if not seal_dir.is_dir():
            raise ConfigError(f"checkpoint {folder} has no {SEAL_CKPT_DIR}/ folder (not written by this trainer); "
                              "start from scratch with trainer.resume_mode=disable")
        self.coevolution.load(seal_dir, step=int(self.global_steps))
        logger.info("restored the SEAL state from %s", seal_dir)

    def _resumed_folder(self) -> Path | None:
        """The ``global_step_<n>`` folder verl's ``_load_checkpoint`` resumed from, if any."""
        mode = str(self.config.trainer.resume_mode)
        if mode == "disable" or int(getattr(self, "global_steps", 0)) == 0:
            return None
        if mode == "resume_path":
            return Path(os.path.abspath(str(self.config.trainer.resume_from_path)))
        return self._checkpoint_root() / f"global_step_{int(self.global_steps)}"

