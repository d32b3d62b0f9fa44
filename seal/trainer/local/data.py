"""The seeded, resumable order in which the local backend visits its training tasks."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from seal.config_base import ConfigError


@dataclass
class DataPosition:
    """Where the sampler stands: ``index`` tasks of epoch ``epoch``'s permutation are consumed."""

    epoch: int = 0
    index: int = 0


class TaskSampler:
    """Fixed-size batches from a per-epoch seeded permutation (verl's ``drop_last``).

    The order depends only on ``(seed, epoch)``, so a resumed run given the saved
    :class:`DataPosition` visits exactly the tasks an uninterrupted run would.
    """

    def __init__(self, task_ids: Sequence[str], batch_size: int, *, seed: int, shuffle: bool = True) -> None:
        if batch_size <= 0:
            raise ConfigError(f"data.train_batch_size={batch_size}: must be positive")
        if len(task_ids) < batch_size:
            raise ConfigError(f"data.train_batch_size={batch_size} exceeds the {len(task_ids)} training tasks; "
                              "lower it or select more tasks (seal.tasks)")
        self.task_ids = list(task_ids)
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.pos = DataPosition()

    @property
    def steps_per_epoch(self) -> int:
        return len(self.task_ids) // self.batch_size

    def permutation(self, epoch: int) -> list[str]:
        ids = list(self.task_ids)
        if self.shuffle:
            random.Random(f"{self.seed}:{epoch}").shuffle(ids)
        return ids

    def next_batch(self) -> tuple[list[str], int, bool]:
        """``(task_ids, epoch, ends_epoch)`` for the next step; advances the position."""
        epoch, start = self.pos.epoch, self.pos.index
        batch = self.permutation(epoch)[start : start + self.batch_size]
        self.pos.index += self.batch_size
        ends = self.pos.index + self.batch_size > len(self.task_ids)
        if ends:
            self.pos = DataPosition(epoch + 1, 0)
        return batch, epoch, ends

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.pos.epoch, "index": self.pos.index, "seed": self.seed, "num_tasks": len(self.task_ids)}

    def load_state_dict(self, data: dict[str, int]) -> None:
        if data.get("seed") != self.seed or data.get("num_tasks") != len(self.task_ids):
            raise ConfigError(
                f"resume: the checkpoint's task order (data.seed={data.get('seed')}, {data.get('num_tasks')} tasks) "
                f"differs from this config's (data.seed={self.seed}, {len(self.task_ids)} tasks); "
                "resume with the original task settings or start a new run"
            )
        self.pos = DataPosition(int(data["epoch"]), int(data["index"]))
