"""The ``seal_cpu`` rollout samples from the updated policy after verl's weight sync.

verl's own hybrid worker (``ActorRolloutRefWorker``, role ``actor_rollout``) runs in this process on
the project's CPU platform with the ``seal_cpu`` rollout: one actor update through verl's V1 step
methods (the worker handed each ``KVBatchMeta`` through verl's TransferQueue bridge), then verl's
``update_weights`` (naive mode, as the trainer's checkpoint manager calls it after every step)
drains the actor's full tensors into :class:`SealCpuRollout`, which loads them into the
:class:`SealCpuServer`. The server's greedy log-probs must change, and must equal the updated
actor's own log-probs of the same tokens. With the weight transfer cut (the rollout drops the
tensors) the check fails.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch
from test_verl_update_direction import RESPONSE_MASK, multi_turn_group, put_multi_turn_group, recipe  # noqa: F401
from verl_actor import actor_worker, put_fields, put_group, verl_logprobs
from verl_testkit import episode_fields, make_trainer

pytest.importorskip("verl")

from seal.trainer.verl import cpu_rollout  # noqa: E402

PROMPT_LEN = 24


class _LocalHandle:
    """A Ray actor handle's ``.method.remote(...)`` over an object in this process."""

    def __init__(self, target: Any) -> None:
        self.target = target

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.target, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            result = method(*args, **kwargs)
            return await result if asyncio.iscoroutine(result) else result

        return type("Remote", (), {"remote": staticmethod(call)})()


@pytest.fixture(scope="module")
def cpu_verl_rollout(recipe: Any) -> Any:  # noqa: F811
    from omegaconf import open_dict
    from transformers import AutoTokenizer

    from seal.trainer.verl.cpu import in_process

    config = recipe.copy()
    with open_dict(config):
        config.actor_rollout_ref.rollout.name = cpu_rollout.ROLLOUT_NAME
        config.actor_rollout_ref.rollout.free_cache_engine = False
    model_dir = config.actor_rollout_ref.model.path
    # The server needs a tokenizer for its pad/eos ids only; the tiny model's ids stay below 128.
    AutoTokenizer.from_pretrained("models/SmolLM2-135M-Instruct").save_pretrained(model_dir)
    with in_process():
        yield config


def _greedy(server: cpu_rollout.SealCpuServer, prompt: list[int], n: int) -> tuple[list[int], torch.Tensor]:
    out = asyncio.run(server.generate("r", prompt, {"temperature": 0.0, "max_tokens": n}))
    return out.token_ids, torch.tensor(out.log_probs)


@pytest.mark.usefixtures("transfer_queue")
@pytest.mark.parametrize("cut", [False, True], ids=["weights_sent", "weights_dropped"])
def test_the_rollout_samples_from_the_updated_actor(cpu_verl_rollout: Any, cut: bool, tmp_path: Any,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    config = cpu_verl_rollout
    worker = actor_worker(config, role="actor_rollout")
    assert isinstance(worker.rollout, cpu_rollout.SealCpuRollout)
    server = cpu_rollout.SealCpuServer(config.actor_rollout_ref.model.path, max_batch_size=2, seed=0)
    worker.rollout._server = _LocalHandle(server)
    if cut:
        original = cpu_rollout.SealCpuServer.update_weights
        monkeypatch.setattr(cpu_rollout.SealCpuServer, "update_weights",
                            lambda self, named, **kwargs: original(self, {}, **kwargs))

    trainer = make_trainer(config, tmp_path, step=1, rollout_n=None)
    trainer.actor_rollout_wg = worker
    prompt, _ = multi_turn_group()
    tokens_before, logprobs_before = _greedy(server, prompt, 4)

    metrics: dict = {}
    batch = trainer._balance_batch(put_multi_turn_group(step=1), metrics)
    old = verl_logprobs(trainer, batch)
    signs = [1.0 if k.split("_")[1] == "0" else -1.0 for k in batch.keys]  # +1 on the passing response
    put_fields(batch, ref_log_prob=old, advantages=[torch.full((len(RESPONSE_MASK),), s) for s in signs])
    trainer._update_actor(batch, metrics)
    assert "actor/pg_loss" in metrics
    asyncio.run(worker.update_weights(global_steps=1, mode="naive"))

    tokens_after, logprobs_after = _greedy(server, prompt, 4)
    probe = put_group(prompt, [tokens_after], [[1] * len(tokens_after)], [episode_fields("multi_turn_base_3", 0.0, [])])
    [actor] = verl_logprobs(trainer, probe)

    moved = tokens_before != tokens_after or not torch.allclose(logprobs_before, logprobs_after, atol=1e-5)
    matches_actor = torch.allclose(logprobs_after, actor, atol=1e-4, rtol=1e-4)
    assert (moved and matches_actor) is (not cut), (logprobs_before, logprobs_after, actor)
