"""The tag vocabulary is exhaustive and consistent (each release tag registered in ``seal_shared.tags``
with its weight, description and paper label); config helpers reject typos."""

from dataclasses import dataclass

import pytest

from seal_shared.tags import default_tag_weights, excluded_tags, get_tag, guideline_excluded_tags
from seal_shared.types import (
    PAPER_LABEL_DESCRIPTIONS,
    UNKNOWN_TAG,
    FailureTag,
    PaperLabel,
    category_of,
    dataclass_from_mapping,
)

RELEASE_TAGS = {
    "gt_error", "spurious_tool_call", "correct_abstention", "empty_turn_model_response", "instance_mismatch",
    "checker_error", "state_mismatch", "response_mismatch", "pass",
}  # fmt: skip


def test_failure_tags_are_the_release_nine() -> None:
    assert {str(t) for t in FailureTag} == RELEASE_TAGS
    assert UNKNOWN_TAG not in RELEASE_TAGS


@pytest.mark.parametrize("tag", list(FailureTag))
def test_every_tag_has_weight_description_and_paper_label(tag: FailureTag) -> None:
    definition = get_tag(tag)
    assert definition.weight > 0 and default_tag_weights()[tag] == definition.weight
    assert len(definition.description) > 20
    assert isinstance(definition.paper_label, PaperLabel)


def test_paper_vocabulary() -> None:
    assert {str(p) for p in PaperLabel} - {"none"} == {
        "invalid_tool_call", "argument_mismatch", "missing_tool_call", "recovery_failure", "state_mismatch",
        "response_mismatch",
    }  # fmt: skip
    assert set(PAPER_LABEL_DESCRIPTIONS) == set(PaperLabel)


def test_release_default_weights_and_excluded_sets() -> None:
    weights = default_tag_weights()
    assert weights[FailureTag.SPURIOUS_TOOL_CALL] == 2.0
    assert weights[FailureTag.CORRECT_ABSTENTION] == 1.8
    assert weights[FailureTag.EMPTY_TURN_MODEL_RESPONSE] == 1.5
    assert weights[FailureTag.RESPONSE_MISMATCH] == 0.9
    assert weights[FailureTag.INSTANCE_MISMATCH] == 0.6
    assert excluded_tags() == {"checker_error", "gt_error"}
    assert guideline_excluded_tags() == {"checker_error", "gt_error", "pass", "correct_abstention", "unknown"}


def test_category_of() -> None:
    assert category_of("multi_turn_long_context_199") == "multi_turn_long_context"
    with pytest.raises(ValueError, match="trailing|does not end"):
        category_of("multi_turn_base")


@dataclass
class _Cfg:
    a: int = 1
    b: str = "x"


def test_dataclass_from_mapping() -> None:
    assert dataclass_from_mapping(_Cfg, {"a": 3}, section="s") == _Cfg(a=3)
    assert dataclass_from_mapping(_Cfg, None, section="s") == _Cfg()
    inst = _Cfg(a=5)
    assert dataclass_from_mapping(_Cfg, inst, section="s") is inst
    with pytest.raises(ValueError, match=r"s: unknown key\(s\) \['c'\]"):
        dataclass_from_mapping(_Cfg, {"c": 1}, section="s")
    with pytest.raises(TypeError, match="expected a mapping"):
        dataclass_from_mapping(_Cfg, [1], section="s")


def test_core_imports_without_torch() -> None:
    """The environment service imports the core; nothing there may pull in torch."""
    import subprocess
    import sys

    code = (
        "import sys, seal_shared.types, seal_shared.tags, seal_shared.interface, seal_shared.plugins, seal.diagnosis,"
        " seal.interface, seal.rewards, seal.advantage;"
        "from seal.advantage import APatchConfig, update_dynamic_weights;"
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
