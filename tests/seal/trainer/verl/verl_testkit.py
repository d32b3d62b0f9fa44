"""Helpers of the verl-backend tests: hand-built ``DataProto`` batches and a ``SealRayPPOTrainer``
built without Ray workers (the hooks under test need none)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import torch

from seal.episode import FIELD_NAMES
from seal_shared.types import FailureTag

TASKS = ["multi_turn_base_3", "multi_turn_miss_func_7"]
N_ROLLOUTS = 4
RESPONSE_LEN = 6
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


def episode_fields(task_id: str, reward: float, tags: list, fault: str | None = None) -> dict[str, Any]:
    """One episode's ``extra_fields`` as the runner writes them; ``fault``: ``env_fault``,
    ``llm_fault`` or ``excluded`` (a prompt that did not fit)."""
    from seal.episode import EpisodeResult, Evaluation

    evaluation = Evaluation.from_wire({"valid": reward >= 1.0, "failure_tags": [str(t) for t in tags]})
    result = EpisodeResult(task_id=task_id, category=task_id.rsplit("_", 1)[0], evaluation=evaluation,
                           reward=reward, env_fault=fault == "env_fault", llm_fault=fault == "llm_fault",
                           excluded=fault is not None)
    return result.to_fields()


def make_batch(faults: dict[int, str] | None = None, seed: int = 0, rewards: dict[int, float] | None = None) -> Any:
    """A training batch as verl's ``fit()`` holds it right after ``compute_advantage``.

    Rows are ``len(TASKS) * N_ROLLOUTS`` episodes; ``faults`` maps a row to ``env_fault``,
    ``llm_fault`` or ``excluded`` (set, as the episode runner does, for every faulted row);
    ``rewards`` overrides rows' rewards. As in ``fit()``: the step rules first (the SEAL hook
    before the old log-probs), then verl's own ``compute_advantage`` with the SEAL estimator.
    """
    from verl import DataProto
    from verl.trainer.ppo.ray_trainer import compute_advantage

    from seal.advantage.grpo import SEAL_GRPO
    from seal.trainer.verl.batch import select_rows

    faults = faults or {}
    episodes = [((rewards or {}).get(i, reward), tags) for i, (reward, tags) in enumerate(EPISODES)]
    gen = torch.Generator().manual_seed(seed)
    b = len(episodes)
    lengths = torch.randint(2, RESPONSE_LEN + 1, (b,), generator=gen)
    mask = (torch.arange(RESPONSE_LEN).unsqueeze(0) < lengths.unsqueeze(1)).to(torch.int64)
    scores = torch.zeros(b, RESPONSE_LEN)
    for i, (reward, _) in enumerate(episodes):
        scores[i, int(lengths[i]) - 1] = reward
    task_ids = [t for t in TASKS for _ in range(N_ROLLOUTS)]
    uids = [f"uid-{t}" for t in task_ids]

    def obj(values: list) -> np.ndarray:
        arr = np.empty(len(values), dtype=object)
        arr[:] = values
        return arr

    records = [episode_fields(task_ids[i], reward, tags, faults.get(i)) for i, (reward, tags) in enumerate(episodes)]
    batch = DataProto.from_single_dict({
        "responses": torch.randint(0, 100, (b, RESPONSE_LEN), generator=gen),
        "response_mask": mask,
        "token_level_scores": scores,
        "token_level_rewards": scores.clone(),
        "uid": obj(uids),
        "data_source": obj([t.rsplit("_", 1)[0] for t in task_ids]),
        # The episode runner's extra_fields, one column per key (verl's agent-loop post-processing).
        **{name: obj([r[name] for r in records]) for name in FIELD_NAMES},
    })
    select_rows(batch, n=N_ROLLOUTS)
    return compute_advantage(batch, adv_estimator=SEAL_GRPO, num_repeat=N_ROLLOUTS)


class FakeWorkerGroup:
    """Stands in for the actor/rollout worker group in verl's checkpoint methods."""

    def __init__(self) -> None:
        self.saved: list[tuple[str, int]] = []
        self.loaded: list[str] = []

    def save_checkpoint(self, local_path: str, remote_path: Any, global_step: int,
                        max_ckpt_to_keep: Any = None) -> None:
        Path(local_path).mkdir(parents=True, exist_ok=True)
        self.saved.append((local_path, global_step))

    def load_checkpoint(self, local_path: str, del_local_after_load: bool = False) -> None:
        self.loaded.append(local_path)


class FakeLoader(list):
    """A train dataloader of ``steps`` batches with the StatefulDataLoader state methods."""

    def state_dict(self) -> dict[str, int]:
        return {"consumed": len(self)}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.restored = state


def make_trainer(cfg: Any, exp_dir: Path, *, step: int = 1, steps_per_epoch: int = 12, total_steps: int = 72) -> Any:
    """A ``SealRayPPOTrainer`` with the attributes its hooks and verl's checkpoint methods read.

    ``RayPPOTrainer.__init__`` (datasets, worker mapping) is bypassed: the hooks under test are
    the subclass's, and the verl code they call runs on these attributes.
    """
    from seal.trainer.coevolution import CoEvolution
    from seal.trainer.verl.trainer import SealRayPPOTrainer, use_seal_grpo

    trainer = object.__new__(SealRayPPOTrainer)
    trainer.config = copy.deepcopy(cfg)
    use_seal_grpo(trainer.config)  # as __init__ does
    trainer.coevolution = CoEvolution(cfg, exp_dir)
    trainer.global_steps = step
    trainer.total_training_steps = total_steps
    trainer.train_dataloader = FakeLoader(range(steps_per_epoch))
    trainer.actor_rollout_wg = FakeWorkerGroup()
    trainer.use_critic = False
    return trainer
