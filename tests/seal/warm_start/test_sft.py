"""The local supervised fine-tune: it learns the model-written tokens and only those."""

from __future__ import annotations

import pytest
import torch

from env_service.client import EnvClient
from seal.warm_start.settings import WarmStartSettings
from seal.warm_start.sft import supervised_finetune, transcript_nll
from seal.warm_start.transcripts import Transcript, build_transcripts

from .conftest import TASKS, notes_cfg, tiny_model

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def transcripts(tokenizer) -> list[Transcript]:
    client = EnvClient.in_process(env="notes")
    try:
        return build_transcripts(notes_cfg(), tokenizer, client, TASKS)
    finally:
        client.close()


def _mean_nll(model, transcripts, *, masked: bool = True) -> float:
    """Mean NLL over the model-written tokens (``masked``) or over the observation tokens."""
    total, count = 0.0, 0
    with torch.no_grad():
        for t in transcripts:
            flipped = t if masked else Transcript(t.task_id, t.prompt_ids, t.response_ids,
                                                  tuple(1 - m for m in t.response_mask), t.messages)
            total += float(transcript_nll(model, flipped, CPU))
            count += flipped.trained_tokens
    return total / count


def test_nll_counts_only_model_written_tokens(tokenizer, transcripts) -> None:
    from seal.trainer.local.policy import response_logprobs

    model = tiny_model(tokenizer)
    t = transcripts[0]
    with torch.no_grad():
        logp = response_logprobs(model, t.prompt_ids, t.response_ids, CPU)
        expected = -sum(float(lp) for lp, m in zip(logp, t.response_mask) if m)
        assert float(transcript_nll(model, t, CPU)) == pytest.approx(expected, rel=1e-5)


def _flip(t: Transcript) -> Transcript:
    return Transcript(t.task_id, t.prompt_ids, t.response_ids, tuple(1 - m for m in t.response_mask), t.messages)


def test_finetune_learns_the_model_written_tokens_and_not_the_observations(tokenizer, transcripts) -> None:
    settings = WarmStartSettings(epochs=4, lr=1e-2, batch_size=2)
    model, flipped = tiny_model(tokenizer), tiny_model(tokenizer)
    before = _mean_nll(model, transcripts)
    report = supervised_finetune(model, transcripts, settings, device=CPU, autocast="none", progress=False)
    supervised_finetune(flipped, [_flip(t) for t in transcripts], settings, device=CPU, autocast="none",
                        progress=False)
    assert report.steps == 4 * 2 and len(report.epoch_losses) == 4
    assert report.trained_tokens == 4 * sum(t.trained_tokens for t in transcripts)
    assert _mean_nll(model, transcripts) < 0.7 * before
    # What is learned follows the mask: trained on the model-written tokens, the model predicts them
    # better and the observations worse than the same fine-tune with the mask flipped.
    assert _mean_nll(model, transcripts) < _mean_nll(flipped, transcripts)
    assert _mean_nll(model, transcripts, masked=False) > _mean_nll(flipped, transcripts, masked=False)


def test_finetune_is_reproducible_from_its_seed(tokenizer, transcripts) -> None:
    settings = WarmStartSettings(epochs=1, lr=1e-3, seed=3)
    a, b = tiny_model(tokenizer), tiny_model(tokenizer)
    supervised_finetune(a, transcripts, settings, device=CPU, autocast="none", progress=False)
    supervised_finetune(b, transcripts, settings, device=CPU, autocast="none", progress=False)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def _nll_where(model, transcripts, closing: bool) -> float:
    """Mean NLL over the model-written tokens of the closing lines (or of the calls)."""
    from seal.trainer.local.policy import response_logprobs

    total, count = 0.0, 0
    with torch.no_grad():
        for t in transcripts:
            logp = response_logprobs(model, t.prompt_ids, t.response_ids, CPU)
            for lp, m, c in zip(logp, t.response_mask, t.closing):
                if m and bool(c) == closing:
                    total, count = total - float(lp), count + 1
    return total / count


def test_the_closing_weight_moves_the_loss_off_the_closing_lines(tokenizer, transcripts) -> None:
    model = tiny_model(tokenizer)
    t = transcripts[0]
    with torch.no_grad():
        from seal.trainer.local.policy import response_logprobs

        logp = response_logprobs(model, t.prompt_ids, t.response_ids, CPU)
        expected = -sum(float(lp) * w for lp, w in zip(logp, t.token_weights(0.2)))
        assert float(transcript_nll(model, t, CPU, 0.2)) == pytest.approx(expected, rel=1e-5)
    full, light = tiny_model(tokenizer), tiny_model(tokenizer)
    before = _nll_where(full, transcripts, closing=True)
    for model, weight in ((full, 1.0), (light, 0.0)):
        supervised_finetune(model, transcripts, WarmStartSettings(epochs=3, lr=1e-2, batch_size=2,
                                                                  closing_weight=weight),
                            device=CPU, autocast="none", progress=False)
    # Weight 0 on the closing lines: the model learns the calls and not the closing lines.
    learned = before - _nll_where(full, transcripts, closing=True)
    assert learned > 0.5 and before - _nll_where(light, transcripts, closing=True) < 0.8 * learned
