"""The task dataset verl's trainer iterates: one small row per task, never the long prompt.

The parquet files' ``prompt`` column (13k-30k characters) is ignored: the environment service
renders the real prompt from the task id, and verl's ``RLHFDataset`` would carry and tokenise it.
:class:`TaskDataset` is built from task ids (``extra_info.index``, after the ``seal.tasks`` filters,
as on the local backend) and yields ``task_id``, ``rollout_mode``, ``agent_name``, a placeholder
``raw_prompt``, ``data_source`` (the task store's category, by which verl groups its ``val-core``
metrics), ``extra_info`` / ``index`` and the dummy tensor verl's collate needs. The trainer adds
each row's ``env_params`` right before rollout.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from omegaconf import DictConfig
from torch.utils.data import Dataset

from seal.config_base import ConfigError
from seal.environment import catalogue_of, environment_name
from seal_shared import DEFAULT_ENVIRONMENT

AGENT_NAME = "seal"
ROLLOUT_MODES = ("sample", "validate")
SPLIT_MODES = {"train": "sample", "val": "validate"}


class TaskDataset(Dataset):
    """One row per task id of environment ``env``; see the module docstring for the fields of a row."""

    def __init__(self, task_ids: Sequence[str], *, rollout_mode: str, agent_name: str = AGENT_NAME,
                 env: str = DEFAULT_ENVIRONMENT) -> None:
        if rollout_mode not in ROLLOUT_MODES:
            raise ValueError(f"rollout_mode={rollout_mode!r}: choose one of {list(ROLLOUT_MODES)}")
        if not task_ids:
            raise ConfigError(f"no {rollout_mode} tasks: check data.*_files and seal.tasks")
        self.task_ids = [str(t) for t in task_ids]
        categories = catalogue_of(env).categories_of(self.task_ids)
        self.categories = [categories[t] for t in self.task_ids]
        self.rollout_mode = rollout_mode
        self.agent_name = agent_name

    @classmethod
    def from_config(cls, cfg: DictConfig, split: str, *, tokenizer: Any = None) -> TaskDataset:
        """The ``train`` or ``val`` tasks of an experiment config (``data.*_files`` + ``seal.tasks``).

        With the policy's ``tokenizer``, tasks whose real initial prompt is longer than
        ``seal.tasks.max_prompt_tokens`` are dropped (rendered through the environment service
        as the episode runner renders them, see :mod:`seal.rollout.prompt_length`); for the
        training split the limit defaults to the rollout's prompt length
        (``data.max_prompt_length``), which an episode's prompt must fit anyway.
        """
        from seal.trainer.tasks import select_task_ids

        if split not in SPLIT_MODES:
            raise ValueError(f"split={split!r}: choose one of {list(SPLIT_MODES)}")
        agent_name = str(cfg.actor_rollout_ref.rollout.agent.default_agent_loop)
        env = environment_name(cfg)
        if tokenizer is None:
            return cls(select_task_ids(cfg, split), rollout_mode=SPLIT_MODES[split], agent_name=agent_name, env=env)
        from seal.rollout.prompt_length import default_max_prompt_tokens, prompt_token_counter
        from seal.environment import make_env_client

        client = make_env_client(cfg)
        try:
            counter = prompt_token_counter(cfg, tokenizer, client, rollout_mode=SPLIT_MODES[split])
            ids = select_task_ids(cfg, split, prompt_tokens=counter,
                                  default_max_prompt_tokens=default_max_prompt_tokens(cfg) if split == "train" else None)
        finally:
            client.close()
        return cls(ids, rollout_mode=SPLIT_MODES[split], agent_name=agent_name, env=env)

    def __len__(self) -> int:
        return len(self.task_ids)

    def __getitem__(self, item: int) -> dict[str, Any]:
        task_id = self.task_ids[item]
        return {
            "task_id": task_id,
            "rollout_mode": self.rollout_mode,
            "agent_name": self.agent_name,
            "data_source": self.categories[item],
            "raw_prompt": [{"role": "user", "content": task_id}],
            "extra_info": {"index": task_id},
            "index": task_id,
            "dummy_tensor": torch.tensor([0], dtype=torch.uint8),
        }

