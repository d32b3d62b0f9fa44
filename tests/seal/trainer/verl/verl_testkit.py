"""Helpers of the verl-backend tests: a training step's episodes in TransferQueue, put there by
verl's own agent-loop post-processing, and a ``SealPPOTrainer`` built without Ray workers.

verl's V1 trainer holds a step's batch in TransferQueue and hands its methods a ``KVBatchMeta``.
:func:`put_outputs` puts agent-loop outputs there with verl's ``AgentLoopWorkerTQ`` post-processing
(the fields and tags a real episode gets); :func:`make_step` builds a step of the records in
:data:`EPISODES` as the SEAL agent loop returns them. :func:`make_trainer` builds the trainer with
stand-in worker groups (:class:`FakeWorkerGroup`) that read and write TransferQueue as verl's
workers do; :func:`run_step` runs verl's own ``_step_once`` on a batch. These need the
``transfer_queue`` fixture (conftest.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import fcntl
import json
import tempfile
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from seal_shared.types import FailureTag

TASKS = ["multi_turn_base_3", "multi_turn_miss_func_7"]
N_ROLLOUTS = 4
RESPONSE_LEN = 6
PROMPT_LEN = 5
EOS_ID, PAD_ID = 2, 0
# Per row: reward, per-turn tags. Each task's group mixes passes and failures so GRPO gives
# non-zero advantages, and the tags differ so A-Patch scales rows differently.
EPISODES = [
    (1.0, [FailureTag.PASS, FailureTag.PASS]),
    (0.0, [FailureTag.PASS, FailureTag.SPURIOUS_TOOL_CALL]),
    (0.0, [FailureTag.STATE_MISMATCH, FailureTag.EMPTY_TURN_MODEL_RESPONSE]),
    (1.0, [FailureTag.PASS, FailureTag.PASS]),
    (0.0, [FailureTag.INSTANCE_MISMATCH, FailureTag.RESPONSE_MISMATCH]),
    (1.0, [FailureTag.PASS, FailureTag.PASS, FailureTag.CORRECT_ABSTENTION]),
    (0.0, [FailureTag.RESPONSE_MISMATCH, FailureTag.GT_ERROR]),
    (0.0, [FailureTag.SPURIOUS_TOOL_CALL, FailureTag.SPURIOUS_TOOL_CALL]),
]


def episode_fields(task_id: str, reward: float, tags: list, fault: str | None = None,
                   call_turns: tuple[int, ...] = ()) -> dict[str, Any]:
    """One episode's record fields as the runner writes them; ``fault``: ``env_fault``,
    ``llm_fault`` or ``excluded`` (a prompt that did not fit)."""
    from seal.episode import EpisodeResult, Evaluation

    evaluation = Evaluation.from_wire({"valid": reward >= 1.0, "failure_tags": [str(t) for t in tags]})
    result = EpisodeResult(task_id=task_id, category=task_id.rsplit("_", 1)[0], evaluation=evaluation,
                           reward=reward, env_fault=fault == "env_fault", llm_fault=fault == "llm_fault",
                           excluded=fault is not None, call_turns=tuple(call_turns))
    return result.to_fields()


def agent_extra_fields(fields: dict[str, Any] | None, step: int) -> dict[str, Any]:
    """An output's ``extra_fields`` as :class:`~seal.rollout.agent_loop.SealAgentLoop` writes them:
    the record (None: no SEAL record, as another agent loop's episode), the record again for the
    validation log, and the policy versions verl's staleness tags read."""
    from seal.episode import RECORD_KEY
    from seal.rollout.agent_loop import policy_versions

    extra = dict(fields or {})
    if fields is not None:
        extra["reward_extra_info"] = {RECORD_KEY: json.dumps(fields)}
    extra.update(policy_versions([], step))
    return extra


# --------------------------------------------------------------------- TransferQueue

# One small Ray at a time across the pytest-xdist workers (and any other run of these tests on
# this machine): a process that needs TransferQueue while another holds it waits for it.
RAY_LOCK = Path(tempfile.gettempdir()) / "seal-verl-tests-ray.lock"
_running = False


@contextlib.contextmanager
def transfer_queue_running() -> Iterator[None]:
    """A small local Ray (4 logical CPUs, no dashboard) and TransferQueue on it with one storage
    unit, as verl's V1 trainer starts them (``tq.init``); closed on exit. Re-entrant in one process
    (an inner use leaves them to the outer); a Ray this process started otherwise is used as it
    is and left running."""
    global _running
    if _running:
        yield
        return
    import ray
    import transfer_queue as tq
    from omegaconf import OmegaConf

    with open(RAY_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        started = not ray.is_initialized()
        if started:
            # address="local": a new cluster of this process's own, never one another job runs here.
            ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
        try:
            tq.init(OmegaConf.create({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}}))
            _running = True
            try:
                yield
            finally:
                _running = False
                tq.close()
        finally:
            if started:
                ray.shutdown()


def clear_partition(partition: str = "train") -> None:
    """Drop every key of a TransferQueue partition (what earlier tests left there)."""
    import transfer_queue as tq

    keys = list((tq.kv_list(partition) or {}).get(partition, {}))
    if keys:
        tq.kv_clear(keys=keys, partition_id=partition)


# --------------------------------------------------------------------- episodes in TransferQueue


def tq_agent_loop_worker(tokenizer: Any = None) -> Any:
    """verl's ``AgentLoopWorkerTQ`` (the class under Ray's actor wrapper) with the state its
    TransferQueue post-processing reads; rewards come with the episodes (SEAL's agent loop scores them)."""
    from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopWorkerTQ

    worker = object.__new__(AgentLoopWorkerTQ.__ray_metadata__.modified_class)
    worker.processor, worker.tokenizer, worker.mm_processor_kwargs = None, tokenizer, {}
    worker.distillation_enabled = False
    worker.reward_loop_worker_handles = ["reward-loop"]  # verl's default: a streaming reward loop exists
    return worker


def put_outputs(episodes: list[tuple[Any, dict[str, Any]]], *, step: int = 1, partition: str = "train") -> Any:
    """Put ``(AgentLoopOutput, dataset row)`` pairs into TransferQueue with verl's own
    ``AgentLoopWorkerTQ._agent_loop_postprocess`` (each row needs a ``uid``; session ids count up
    per uid) and return the ``KVBatchMeta`` verl's replay buffer would sample: the keys in put
    order, each with its tag as listed in TransferQueue."""
    import transfer_queue as tq
    from transfer_queue import KVBatchMeta

    worker, sessions, keys = tq_agent_loop_worker(), Counter(), []

    async def put() -> None:
        for output, row in episodes:
            session = sessions[row["uid"]]
            sessions[row["uid"]] += 1
            await worker._agent_loop_postprocess(output, partition == "val", **row, session_id=session,
                                                 global_steps=step)
            keys.append(f"{row['uid']}_{session}_0")

    asyncio.run(put())
    listing = tq.kv_list(partition)[partition]
    return KVBatchMeta(keys=keys, tags=[listing[k] for k in keys], partition_id=partition)


def make_step(faults: dict[int, str] | None = None, *, seed: int = 0, rewards: dict[int, float] | None = None,
              call_turns: tuple[int, ...] = (), step: int = 1, records: bool = True) -> Any:
    """A training step of ``len(TASKS) * N_ROLLOUTS`` episodes (:data:`EPISODES`; one GRPO group
    per task, a fresh ``uid`` each call) in TransferQueue; returns its ``KVBatchMeta``, keys in
    :data:`EPISODES` order.

    ``faults`` maps a row to ``env_fault``, ``llm_fault`` or ``excluded``; as the agent loop does,
    such an episode trains on no token (mask 0). ``rewards`` overrides rows' rewards (the record's
    and ``rm_scores``' on the last response token); ``call_turns`` sets every record's tool-call
    turns; ``records=False``: the episodes carry no SEAL record (another agent loop's)."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput

    faults = faults or {}
    gen = torch.Generator().manual_seed(seed)
    uids = {t: uuid.uuid4().hex for t in TASKS}
    prompts = {t: torch.randint(3, 100, (PROMPT_LEN,), generator=gen).tolist() for t in TASKS}
    episodes = []
    for i, (reward, tags) in enumerate(EPISODES):
        task = TASKS[i // N_ROLLOUTS]
        reward = (rewards or {}).get(i, reward)
        length = int(torch.randint(2, RESPONSE_LEN + 1, (1,), generator=gen))
        fields = episode_fields(task, reward, tags, faults.get(i), call_turns) if records else None
        output = AgentLoopOutput(
            prompt_ids=prompts[task], response_ids=torch.randint(3, 100, (length,), generator=gen).tolist(),
            response_mask=[0 if i in faults else 1] * length, response_logprobs=[-0.5] * length,
            reward_score=reward, num_turns=3, metrics=AgentLoopMetrics(),
            extra_fields=agent_extra_fields(fields, step))
        row = {"uid": uids[task], "task_id": task, "index": task, "data_source": task.rsplit("_", 1)[0],
               "rollout_mode": "sample", "extra_info": {"index": task, "epoch": 0}}
        episodes.append((output, row))
    return put_outputs(episodes, step=step)


def read_rows(keys: list[str], *names: str, partition: str = "train") -> dict[str, list[Any]]:
    """Per field, the rows of ``keys`` in that order (tensors unpadded)."""
    import transfer_queue as tq

    data = tq.kv_batch_get(keys=list(keys), partition_id=partition, select_fields=list(names))
    return {n: list(data[n].unbind()) if isinstance(data[n], torch.Tensor) else list(data[n]) for n in names}


def padded(rows: list[torch.Tensor], width: int = RESPONSE_LEN) -> torch.Tensor:
    """``(B, width)`` of 1-D rows, zero-padded on the right."""
    out = torch.zeros(len(rows), width, dtype=rows[0].dtype)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out


# --------------------------------------------------------------------- the trainer


@dataclass
class Update:
    """What one ``update_actor`` call would train on: the batch's keys, its ``extra_info`` and,
    per field, each key's row as read from TransferQueue."""

    keys: list[str]
    extra_info: dict[str, Any]
    rows: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)

    def padded(self, name: str, keys: list[str], width: int = RESPONSE_LEN) -> torch.Tensor:
        return padded([self.rows[name][k] for k in keys], width)


# What the stand-in update reads of each row (verl's worker is given every field of its rows).
UPDATE_FIELDS = ("advantages", "response_mask", "loss_mask", "old_log_probs", "ref_log_prob", "extra_fields")


def _put_like_input(batch: Any, values: dict[str, float]) -> None:
    """Write per-token outputs shaped like each row's ``input_ids`` (prompt and response), as
    verl's workers return log-probs and entropy."""
    import transfer_queue as tq
    from tensordict import TensorDict

    ids = read_rows(batch.keys, "input_ids", partition=batch.partition_id)["input_ids"]
    fields = {name: torch.nested.as_nested_tensor([torch.full(row.shape, v) for row in ids], layout=torch.jagged)
              for name, v in values.items()}
    tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=TensorDict(fields, batch_size=len(batch)))


class FakeWorkerGroup:
    """The actor (and reference) worker group as verl's V1 trainer calls it: each call takes the
    step's ``KVBatchMeta``, reads its rows from TransferQueue and writes its outputs there, as
    verl's workers do through their TransferQueue bridge. Calls are recorded; the checkpoint
    methods create the folder they are given. ``dp``: data-parallel ranks (verl's
    ``_balance_batch`` pads the batch to a multiple of them)."""

    def __init__(self, dp: int = 1) -> None:
        self._dispatch_info = {"actor": list(range(dp))}
        self.saved: list[tuple[str, int]] = []
        self.loaded: list[str] = []
        self.log_prob_calls: list[dict[str, Any]] = []
        self.ref_calls: list[dict[str, Any]] = []
        self.updates: list[Update] = []

    def save_checkpoint(self, local_path: str, remote_path: Any, global_step: int,
                        max_ckpt_to_keep: Any = None) -> None:
        Path(local_path).mkdir(parents=True, exist_ok=True)
        self.saved.append((local_path, global_step))

    def load_checkpoint(self, local_path: str, del_local_after_load: bool = False) -> None:
        self.loaded.append(local_path)

    def compute_log_prob(self, batch: Any) -> Any:
        self.log_prob_calls.append(dict(batch.extra_info))
        _put_like_input(batch, {"log_probs": -0.5, "entropy": 1.0})
        return batch

    def compute_ref_log_prob(self, batch: Any) -> Any:
        self.ref_calls.append(dict(batch.extra_info))
        _put_like_input(batch, {"log_probs": -0.6})
        return batch

    def update_actor(self, batch: Any) -> Any:
        from verl.utils import tensordict_utils as tu

        rows = read_rows(batch.keys, *UPDATE_FIELDS, partition=batch.partition_id)
        self.updates.append(Update(list(batch.keys), dict(batch.extra_info),
                                   {n: dict(zip(batch.keys, rows[n])) for n in UPDATE_FIELDS}))
        return tu.get_tensordict(tensor_dict={}, non_tensor_dict={"metrics": {"pg_loss": 0.25, "mfu": 0.0}})


class FakeLoader(list):
    """A train dataloader of ``steps`` batches with the StatefulDataLoader state methods."""

    def state_dict(self) -> dict[str, int]:
        return {"consumed": len(self)}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.restored = state


class CheckpointEngine:
    """verl's checkpoint-engine manager (weight sync to the rollout servers)."""

    def __init__(self) -> None:
        self.synced: list[int] = []
        self.sleeps = 0

    def update_weights(self, step: int | None = None) -> None:
        self.synced.append(step)

    def sleep_replicas(self) -> None:
        self.sleeps += 1


def make_trainer(cfg: Any, exp_dir: Path, *, step: int = 1, steps_per_epoch: int = 12, total_steps: int = 72,
                 dp: int = 1, rollout_n: int | None = N_ROLLOUTS) -> Any:
    """A ``SealPPOTrainer`` with the attributes its seams and verl's step, checkpoint and
    validation methods read. ``PPOTrainer.__init__`` / ``init()`` (Ray workers, datasets) are
    bypassed; the config gets what ``__init__`` does to it (:func:`use_seal_grpo`).

    ``rollout_n``: set ``actor_rollout_ref.rollout.n`` to it and the actor mini-batch to one step
    of :data:`TASKS` (so verl adds no padding rows at ``dp=1``); None keeps the config's sizes."""
    from omegaconf import open_dict
    from verl.trainer.ppo.checkpoint_callback import build_checkpoint_callback
    from verl.trainer.ppo.utils import need_reference_policy

    from seal.trainer.coevolution import CoEvolution
    from seal.trainer.verl.trainer import SealPPOTrainer, use_seal_grpo

    config = copy.deepcopy(cfg)
    if rollout_n is not None:
        with open_dict(config):
            config.actor_rollout_ref.rollout.n = rollout_n
            config.actor_rollout_ref.actor.ppo_mini_batch_size = len(TASKS)
    use_seal_grpo(config)  # as __init__ does
    trainer = object.__new__(SealPPOTrainer)
    trainer.config = config
    trainer.checkpoint_callback = build_checkpoint_callback(config)
    trainer.use_critic, trainer.use_reference_policy = False, need_reference_policy(config)
    trainer.trainer_mode, trainer.parameter_sync_step = "sync", 1
    trainer.coevolution = CoEvolution(config, Path(exp_dir))
    trainer._step = None
    trainer.global_steps, trainer.steps_per_epoch, trainer.total_training_steps = step, steps_per_epoch, total_steps
    trainer.train_dataloader = FakeLoader(range(steps_per_epoch))
    trainer.actor_rollout_wg = trainer.ref_policy_wg = FakeWorkerGroup(dp)
    trainer.ref_in_actor = False
    trainer.tokenizer = SimpleNamespace(eos_token_id=EOS_ID, pad_token_id=PAD_ID)
    trainer.distillation_config = None
    trainer.checkpoint_manager = CheckpointEngine()
    trainer.reward_loop_manager = SimpleNamespace(reward_loop_worker_handles=["reward-loop"])
    trainer.curr_step_profile = False
    return trainer


class _Sampled:
    """verl's replay buffer, sampling the one batch it was given."""

    def __init__(self, batch: Any) -> None:
        self.batch = batch

    def sample(self, global_steps: int, partition_id: str, batch_size: int) -> tuple[Any, dict]:
        assert partition_id == self.batch.partition_id and batch_size == len(self.batch)
        return self.batch, {}


def run_to_advantages(trainer: Any, batch: Any) -> tuple[Any, dict[str, Any]]:
    """verl's V1 step up to its advantages, in ``_step_once``'s order through the trainer's
    methods: the balance (and the step rules), the old and reference log-probs,
    ``_compute_advantage``. Returns the balanced batch and the metrics."""
    metrics: dict[str, Any] = {}
    batch = trainer._balance_batch(batch, metrics)
    batch = trainer._compute_old_log_prob(batch, metrics)
    if trainer.use_reference_policy:
        batch = trainer._compute_ref_log_prob(batch, metrics)
    return trainer._compute_advantage(batch, metrics), metrics


def run_step(trainer: Any, batch: Any) -> tuple[Any, dict[str, Any]]:
    """verl's own ``PPOTrainer._step_once`` on ``batch`` (what the replay buffer samples): balance
    (and the step rules), old and reference log-probs, advantages, actor update, each through the
    trainer's methods. Returns the balanced batch and the metrics verl collected."""
    trainer.replay_buffer = _Sampled(batch)
    metrics: dict[str, Any] = {}
    out = trainer._step_once(metrics, {}, len(batch))
    return out, metrics
