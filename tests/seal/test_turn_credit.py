"""Turn credit (``seal.advantage.turn_credit``): which tokens of an episode keep its advantage."""

from __future__ import annotations

import pytest
import torch

from seal.advantage.turn_credit import credit_turns, model_runs
from seal.schema import default_config
from seal.trainer.coevolution import CoEvolution
from seal_shared.types import FailureTag

# Three LLM calls: tokens 0-1 and 4-6 in turn 0, token 8 in turn 1; the rest are observations.
MASK_ROW = [1, 1, 0, 0, 1, 1, 1, 0, 1, 0]
CALL_TURNS = (0, 0, 1)
TURN_0 = [0, 1, 4, 5, 6]
TURN_1 = [8]


def _rows(*advantages: float) -> tuple[torch.Tensor, torch.Tensor]:
    mask = torch.tensor([MASK_ROW] * len(advantages), dtype=torch.float32)
    return mask * torch.tensor(advantages).unsqueeze(-1), mask


def test_model_runs_are_the_calls_spans() -> None:
    assert model_runs(torch.tensor(MASK_ROW)) == [(0, 2), (4, 7), (8, 9)]
    assert model_runs(torch.tensor([0, 0])) == []
    assert model_runs(torch.tensor([1, 1])) == [(0, 2)]


def test_a_right_turn_is_not_pushed_down_and_a_failed_one_not_up() -> None:
    adv, mask = _rows(-0.8, 0.5)
    tags = [[FailureTag.PASS, FailureTag.STATE_MISMATCH]] * 2
    before = adv.clone()
    out, metrics = credit_turns(adv, mask, [CALL_TURNS] * 2, tags)

    assert torch.equal(adv, before)  # pure
    assert out[0, TURN_0].eq(0).all() and out[0, TURN_1].eq(-0.8).all()
    assert out[1, TURN_0].eq(0.5).all() and out[1, TURN_1].eq(0).all()
    assert out[:, [2, 3, 7, 9]].eq(0).all()
    assert metrics["seal/turn_credit/zeroed_token_frac"] == pytest.approx(6 / 12)


def test_what_the_diagnosis_cannot_judge_keeps_its_advantage() -> None:
    adv, mask = _rows(-0.8, -0.8, -0.8, -0.8)
    tags = [[FailureTag.STATE_MISMATCH, FailureTag.GT_ERROR],  # turn 1 cannot be judged
            None,  # not diagnosed
            [FailureTag.PASS, "a_tag_nobody_registered"],
            [FailureTag.PASS, FailureTag.PASS]]
    call_turns = [CALL_TURNS, CALL_TURNS, CALL_TURNS, (0, None, 5)]  # no turn index; a turn out of range
    out, _ = credit_turns(adv, mask, call_turns, tags)

    assert torch.equal(out[0], adv[0]) and torch.equal(out[1], adv[1])
    assert out[2, TURN_0].eq(0).all() and out[2, TURN_1].eq(-0.8).all()
    assert out[3, [0, 1]].eq(0).all() and out[3, [4, 5, 6, 8]].eq(-0.8).all()


def test_a_row_with_more_calls_than_recorded_turns_is_left_as_is() -> None:
    adv, mask = _rows(-0.8, -0.8)
    tags = [[FailureTag.PASS, FailureTag.STATE_MISMATCH]] * 2
    # A record written without call_turns; and a row cut short (two recorded calls, one run left).
    mask[1, 2:] = 0
    adv = adv * mask
    out, metrics = credit_turns(adv, mask, [(), CALL_TURNS], tags)

    assert torch.equal(out[0], adv[0])
    assert out[1].eq(0).all()
    assert metrics["seal/turn_credit/unattributed_rows"] == 1.0


def test_shapes_that_disagree_are_an_error() -> None:
    adv, mask = _rows(-0.8)
    with pytest.raises(ValueError, match="response_mask"):
        credit_turns(adv, mask[:, :4], [CALL_TURNS], [[FailureTag.PASS]])
    with pytest.raises(ValueError, match="2 tag lists for 1"):
        credit_turns(adv, mask, [CALL_TURNS], [[FailureTag.PASS]] * 2)


@pytest.mark.parametrize(("seal_on", "credit_on", "changed"), [(True, True, True), (True, False, False),
                                                                (False, True, False)])
def test_the_hook_follows_its_switch_and_seals(tmp_path, seal_on: bool, credit_on: bool, changed: bool) -> None:
    cfg = default_config()
    cfg.seal.enable = seal_on
    cfg.seal.advantage.turn_credit = credit_on
    adv, mask = _rows(-0.8)
    out, metrics = CoEvolution(cfg, tmp_path).credit_turns(adv, mask, [CALL_TURNS],
                                                            [[FailureTag.PASS, FailureTag.STATE_MISMATCH]])
    assert (not torch.equal(out, adv)) is changed
    assert ("seal/turn_credit/zeroed_token_frac" in metrics) is changed
