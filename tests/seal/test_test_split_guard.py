"""Only a final evaluation reads a test split (``seal_shared.held_out``): the task stores of ``notes``
and BFCL refuse ``test`` and ``eval`` outside :func:`final_evaluation`, and inside it log and record
each read; the catalogue lists train and val only; task selection never reads the test split and
refuses configs that name its tasks, but for the paper's BFCL recipe, which validates on BFCL's
test split on purpose (``seal.tasks.validate_on_test``); ``seal eval --split test`` is the final
evaluation."""

from __future__ import annotations

import logging

import pytest

from env_service.bfcl import tasks as bfcl_tasks
from env_service.client import EnvClient, EnvServiceError
from env_service.notes.episode import default_store
from env_service.registry import get_environment
from seal.config import REPO_ROOT, ConfigError, compose_config
from seal.eval.evaluate import EvalSettings, run_eval
from seal.eval.logs import read_log_file
from seal.eval.policies import Completion
from seal.trainer.tasks import select_task_ids
from seal_shared.held_out import READS, HeldOutSplitError, SplitRead, final_evaluation, final_evaluation_reason

NOTES = default_store()
NOTES_TEST = {i for i in NOTES.ids() if NOTES.get(i).split == "test"}  # from the records, not a split read
QUICKSTART = REPO_ROOT / "exp" / "quickstart.yaml"


def held_out_reads() -> list[SplitRead]:
    return list(READS)


@pytest.mark.parametrize("read", [
    lambda: NOTES.load_split("test"), lambda: NOTES.load_split("eval"), lambda: NOTES.ids("test"),
    lambda: get_environment("notes").load_split("test"), lambda: bfcl_tasks.load_split("test"),
    lambda: bfcl_tasks.default_store().load_split("eval"),
], ids=["notes test", "notes eval", "notes ids(test)", "registry", "bfcl test", "bfcl store eval"])
def test_reading_a_held_out_split_outside_a_final_evaluation_raises(read) -> None:
    before = held_out_reads()
    with pytest.raises(HeldOutSplitError) as err:
        read()
    assert isinstance(err.value, PermissionError) and "\n" not in str(err.value)
    assert "held out for a final evaluation" in str(err.value) and "seal eval --split" in str(err.value)
    assert held_out_reads() == before
    assert len(NOTES.load_split("train")) == 60 and len(NOTES.load_split("val")) == 30  # the others are free


def test_inside_a_final_evaluation_a_read_is_allowed_logged_and_recorded(caplog) -> None:
    before = len(READS)
    with caplog.at_level(logging.WARNING, logger="seal_shared.held_out"):
        with final_evaluation("a unit test"):
            assert final_evaluation_reason() == "a unit test"
            assert set(NOTES.load_split("test")) == NOTES_TEST and len(NOTES_TEST) == 120
            with final_evaluation("an inner scope"):
                assert len(bfcl_tasks.load_split("eval")) == 400
            assert final_evaluation_reason() == "a unit test"
    assert READS[before:] == [SplitRead("notes", "test", "a unit test"), SplitRead("bfcl", "eval", "an inner scope")]
    assert [r.getMessage() for r in caplog.records] == ["reading the test split of notes for a unit test",
                                                        "reading the eval split of bfcl for an inner scope"]
    assert final_evaluation_reason() is None
    with pytest.raises(HeldOutSplitError):
        NOTES.load_split("test")  # the scope ended


def test_the_catalogue_and_the_service_answer_test_only_to_a_final_evaluation() -> None:
    with EnvClient.in_process(env="notes") as client:
        catalogue = client.catalogue()
        assert set(catalogue.splits) == {"train", "val"} and len(catalogue.categories) == 210
        before = len(READS)
        with pytest.raises(HeldOutSplitError):
            catalogue.load_split("test")
        with pytest.raises(EnvServiceError, match="held out for a final evaluation"):
            client.get_env_profile("eval")
        assert len(READS) == before
        with final_evaluation("a unit test"):
            assert set(catalogue.load_split("test")) == NOTES_TEST
            assert len(client.get_env_profile("eval")) == 150
        assert [(r.split, r.reason) for r in READS[before:]] == [("test", "a unit test"), ("eval", "a unit test")]
        with pytest.raises(EnvServiceError):
            client.get_env_profile("test")  # a permitted read is not cached for later callers
        with pytest.raises(ValueError, match="unknown split 'dev'"):
            catalogue.load_split("dev")


@pytest.mark.parametrize("overrides", [[], ["seal.tasks.max_train_tasks=null", "seal.tasks.max_val_tasks=null"],
                                       ["seal.tasks.match_val_categories=true"]])
def test_task_selection_on_the_notes_quickstart_never_touches_test(overrides: list[str]) -> None:
    cfg = compose_config(QUICKSTART, overrides)
    before = len(READS)
    train, val = select_task_ids(cfg, "train"), select_task_ids(cfg, "val")
    assert len(READS) == before
    assert train and val and not (set(train) | set(val)) & NOTES_TEST
    assert {NOTES.get(i).split for i in train} == {"train"} and {NOTES.get(i).split for i in val} == {"val"}


@pytest.mark.parametrize(("key", "ids"), [("seal.tasks.val_ids", "[notes_020,notes_150]"),
                                          ("seal.tasks.train_ids", "[notes_025]")])
def test_a_config_naming_a_test_task_is_refused(key: str, ids: str, caplog) -> None:
    split = key.split(".")[-1].removesuffix("_ids")
    refusal = rf"^{key}: notes_\d+ is in notes's held-out test split, which only a final evaluation reads "
    refusal += ".*validate_on_test"
    with pytest.raises(ConfigError, match=refusal):  # the config check: before the launcher starts anything
        compose_config(QUICKSTART, [f"{key}={ids}"])
    with pytest.raises(ConfigError, match=refusal):  # and task selection itself
        select_task_ids(compose_config(QUICKSTART, [f"{key}={ids}"], check=False), split)
    knowingly = compose_config(QUICKSTART, [f"{key}={ids}", "seal.tasks.validate_on_test=true"])
    before = len(READS)
    with caplog.at_level(logging.WARNING, logger="seal.trainer.tasks"):
        assert select_task_ids(knowingly, split) == ids.strip("[]").split(",")
    assert "seal.tasks.validate_on_test" in caplog.text and len(READS) == before


def test_the_bfcl_paper_recipe_still_validates_on_its_400_eval_tasks(caplog) -> None:
    cfg = compose_config(REPO_ROOT / "exp" / "SEAL.yaml")
    assert cfg.seal.tasks.validate_on_test is True
    before = len(READS)
    with caplog.at_level(logging.WARNING, logger="seal.trainer.tasks"):
        val = select_task_ids(cfg, "val")
    assert len(val) == 400 and len(READS) == before
    assert "data.val_files names 300 task(s) of bfcl's held-out test split" in caplog.text
    assert len(select_task_ids(cfg, "train")) == 400
    with pytest.raises(ConfigError, match="data.val_files: .* are in bfcl's held-out test split"):
        select_task_ids(compose_config(REPO_ROOT / "exp" / "SEAL.yaml", ["seal.tasks.validate_on_test=false"]), "val")
    # The notes configs derive from it and hold notes' test split out again.
    assert compose_config(QUICKSTART).seal.tasks.validate_on_test is False


class DonePolicy:
    """Answers every turn with text, no call."""

    def complete_with_usage(self, messages, sampling) -> Completion:
        return Completion("Done.", prompt_tokens=0, completion_tokens=0, finish_reason="stop")

    def complete(self, messages, sampling) -> str:
        return "Done."


@pytest.mark.parametrize("split", ["test", "val"])
def test_seal_eval_on_test_is_the_final_evaluation(split: str, tmp_path) -> None:
    before = len(READS)
    settings = EvalSettings(env="notes", split=split, limit=2, progress=False, concurrency=1)
    summary = run_eval(settings, DonePolicy(), lambda: EnvClient.in_process(env="notes"), tmp_path)
    records = read_log_file(tmp_path / "validation_log" / "0.jsonl")
    assert {r["split"] for r in records} == {split} and len(summary.task_ids) == 2
    reads = READS[before:]
    if split == "test":
        assert set(summary.task_ids) <= NOTES_TEST
        assert reads and {(r.env, r.split, r.reason) for r in reads} == {("notes", "test", "seal eval --split test")}
    else:
        assert reads == [] and not set(summary.task_ids) & NOTES_TEST
    assert final_evaluation_reason() is None
