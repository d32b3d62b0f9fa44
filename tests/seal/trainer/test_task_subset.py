"""Training on a failure subset: ``seal.tasks.from_tags`` keeps the training tasks whose episodes
in a previous log carry the chosen tags; validation tasks are never filtered."""

from __future__ import annotations

import pytest

from seal.config import REPO_ROOT, ConfigError, compose_config
from seal.eval.logs import ValidationLogWriter, ValidationRecord
from seal.trainer.tasks import expand_tags, select_task_ids, warm_start_task_ids

TRAIN = ["multi_turn_base_1", "multi_turn_base_2", "multi_turn_miss_func_3", "multi_turn_miss_param_4",
         "multi_turn_long_context_5"]
VAL = ["multi_turn_base_10", "multi_turn_long_context_11"]


def _cfg(*extra: str):
    return compose_config(REPO_ROOT / "exp" / "quickstart_bfcl.yaml", [
        f"seal.tasks.train_ids=[{','.join(TRAIN)}]", f"seal.tasks.val_ids=[{','.join(VAL)}]",
        "seal.tasks.max_prompt_tokens=null", "seal.tasks.max_train_tasks=null", *extra])


def _record(task_id: str, tags: list[str], step: int = 0, error: str | None = None) -> ValidationRecord:
    ok = tags == ["pass"]
    return ValidationRecord(task_id=task_id, data_source=task_id.rsplit("_", 1)[0], split="train", step=step,
                            score=float(ok), reward=float(ok), valid=ok, tags=tags, error=error)


@pytest.fixture
def log_dir(tmp_path):
    """A `seal eval --split train` style log: step 0 of an older run, step 5 the latest."""
    w = ValidationLogWriter(tmp_path / "eval" / "validation_log")
    w.write(_record("multi_turn_base_1", ["spurious_tool_call"], step=0))  # only in an older step
    latest = {
        "multi_turn_base_1": ["pass", "pass"],
        "multi_turn_base_2": ["state_mismatch", "spurious_tool_call"],
        "multi_turn_miss_func_3": ["empty_turn_model_response"],
        "multi_turn_miss_param_4": ["spurious_tool_call"],
        "multi_turn_long_context_5": ["instance_mismatch"],
        "multi_turn_base_10": ["spurious_tool_call"],  # a validation task: never selected for training
    }
    for tid, tags in latest.items():
        w.write(_record(tid, tags, step=5))
    # A resumed run's redo: the last record of a task is the one that counts.
    w.write(_record("multi_turn_miss_param_4", ["pass"], step=5))
    w.write(_record("multi_turn_miss_param_4", ["spurious_tool_call", "pass"], step=5))
    # A runner error carries no diagnosis and selects nothing.
    w.write(_record("multi_turn_long_context_5", ["spurious_tool_call"], step=5, error="EnvUnavailableError: x"))
    return tmp_path / "eval"


def test_selects_tagged_training_tasks_from_the_latest_step(log_dir):
    cfg = _cfg("seal.tasks.from_tags=[spurious_tool_call]", f"seal.tasks.from_log={log_dir}")
    assert select_task_ids(cfg, "train") == ["multi_turn_base_2", "multi_turn_miss_param_4"]
    assert select_task_ids(cfg, "val") == VAL  # validation is never filtered


def test_log_file_dir_and_experiment_dir_agree(log_dir):
    wanted = "seal.tasks.from_tags=[empty_turn_model_response,instance_mismatch]"
    by_exp = select_task_ids(_cfg(wanted, f"seal.tasks.from_log={log_dir}"), "train")
    by_dir = select_task_ids(_cfg(wanted, f"seal.tasks.from_log={log_dir / 'validation_log'}"), "train")
    by_file = select_task_ids(_cfg(wanted, f"seal.tasks.from_log={log_dir / 'validation_log' / '5.jsonl'}"), "train")
    assert by_exp == by_dir == by_file == ["multi_turn_miss_func_3", "multi_turn_long_context_5"]
    old = select_task_ids(_cfg("seal.tasks.from_tags=[spurious_tool_call]",
                               f"seal.tasks.from_log={log_dir / 'validation_log' / '0.jsonl'}"), "train")
    assert old == ["multi_turn_base_1"]


def test_paper_label_invalid_tool_call_is_spurious_tool_call(log_dir):
    assert expand_tags(["invalid_tool_call"]) == {"spurious_tool_call"}
    assert expand_tags(["missing_tool_call", "state_mismatch"]) == {"empty_turn_model_response", "state_mismatch"}
    cfg = _cfg("seal.tasks.from_tags=[invalid_tool_call]", f"seal.tasks.from_log={log_dir}")
    assert select_task_ids(cfg, "train") == ["multi_turn_base_2", "multi_turn_miss_param_4"]


def test_categories_and_limit_compose_with_the_subset(log_dir):
    cfg = _cfg("seal.tasks.from_tags=[spurious_tool_call,state_mismatch]", f"seal.tasks.from_log={log_dir}",
               "seal.tasks.categories=[multi_turn_base,multi_turn_miss_param]", "seal.tasks.max_train_tasks=1")
    assert select_task_ids(cfg, "train") == ["multi_turn_base_2"]


@pytest.mark.parametrize("extra, fragment", [
    (["seal.tasks.from_tags=[spurius_tool_call]"], "unknown tag 'spurius_tool_call'"),
    (["seal.tasks.from_tags=[argument_mismatch]"], "no per-turn tag"),
    (["seal.tasks.from_tags=[spurious_tool_call]", "seal.tasks.from_log=null"], "needs seal.tasks.from_log"),
    (["seal.tasks.from_tags=[response_mismatch]"], "no training task carries"),
])
def test_bad_settings_fail_in_one_line(log_dir, extra, fragment):
    overrides = [*extra] if any("from_log" in e for e in extra) else [*extra, f"seal.tasks.from_log={log_dir}"]
    with pytest.raises(ConfigError) as info:
        select_task_ids(_cfg(*overrides), "train")
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_missing_log_names_the_key(tmp_path):
    cfg = _cfg("seal.tasks.from_tags=[pass]", f"seal.tasks.from_log={tmp_path / 'nothing'}")
    with pytest.raises(ConfigError, match="seal.tasks.from_log"):
        select_task_ids(cfg, "train")


def test_no_filter_by_default():
    cfg = _cfg()
    assert cfg.seal.tasks.from_tags is None and cfg.seal.tasks.from_log is None
    assert select_task_ids(cfg, "train") == TRAIN


def test_category_shares_follow_the_reference_and_pass_on_a_shortfall():
    from seal.trainer.tasks import in_category_shares

    ids = [f"t{i}" for i in range(12)]
    cats = dict(zip(ids, ["a", "a", "a", "a", "a", "a", "b", "b", "b", "c", "d", "d"]))
    # Reference a 1/2, b 1/4, c 1/4 -> of 8: a 4, b 2, c 2; c has one task, so a (most frequent) takes its slot.
    picked = in_category_shares(ids, cats, ["a", "a", "b", "c"], 8)
    assert picked == ["t0", "t1", "t2", "t3", "t4", "t6", "t7", "t9"]
    # Largest remainder: of 3 with shares 1/2, 1/4, 1/4 -> a 1.5, b 0.75, c 0.75 -> a 1, b 1, c 1.
    assert sorted(cats[i] for i in in_category_shares(ids, cats, ["a", "a", "b", "c"], 3)) == ["a", "b", "c"]
    # Categories the reference lacks fill what is left, in listed order; never more than there are.
    assert in_category_shares(ids, cats, ["c"], 3) == ["t0", "t1", "t9"]
    assert len(in_category_shares(ids, cats, ["a"], 50)) == 12


def test_match_val_categories_draws_the_rl_tasks_in_the_held_out_shares():
    from collections import Counter

    from seal.environment import task_categories

    conf = REPO_ROOT / "exp" / "learning" / "notes_binary_wide.yaml"
    listed = select_task_ids(compose_config(conf, []), "train")
    cfg = compose_config(conf, ["seal.tasks.match_val_categories=true"])
    matched = select_task_ids(cfg, "train")
    val = Counter(task_categories(cfg, select_task_ids(cfg, "val")).values())
    assert val == {"single_app": 14, "cross_app": 10, "abstain": 6}
    assert "abstain" not in task_categories(cfg, listed).values()  # as listed, RL never sees an abstain task
    # 24 x (14, 10, 6) / 30 = 11.2, 8, 4.8 -> 11, 8, 5; only 10 single_app tasks are left after the
    # warm start's, so cross_app, the next most frequent, takes the eleventh slot.
    pool = Counter(task_categories(cfg, select_task_ids(compose_config(conf, ["seal.tasks.max_train_tasks=null"]),
                                                        "train")).values())
    assert pool["single_app"] == 10
    assert Counter(task_categories(cfg, matched).values()) == {"single_app": 10, "cross_app": 9, "abstain": 5}
    assert len(matched) == 24 and not set(matched) & set(warm_start_task_ids(cfg))
