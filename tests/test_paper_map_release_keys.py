"""docs/paper_map.md maps every leaf key of the release's exp/SEAL.yaml to ours, or says why none.

The release's key paths are data (tests/data/release_seal_yaml_keys.txt, 139 paths). A key with
no row fails; a row that names one of our keys with a value is checked against the composed
exp/SEAL.yaml, so the table cannot drift from the config.
"""

from __future__ import annotations

import re

import pytest
from omegaconf import OmegaConf

from seal.config import REPO_ROOT, compose_config

KEYS_FILE = REPO_ROOT / "tests" / "data" / "release_seal_yaml_keys.txt"
PAPER_MAP = REPO_ROOT / "docs" / "paper_map.md"
SECTION = "## Every key of the release's exp/SEAL.yaml"
# "same key = v", or "`our.key` = v" / "`our.key` = `v`" at the start of the "ours" column.
OURS = re.compile(r"^(?:same key|`(?P<key>[\w.]+)`) = `?(?P<value>[^`|]*?)`?(?: \(|$)")


def release_keys() -> list[str]:
    return [line.strip() for line in KEYS_FILE.read_text(encoding="utf-8").splitlines() if line.strip()]


def table_rows(text: str) -> dict[str, list[str]]:
    """``release key -> [release value, ours, note]`` from the section's table."""
    if SECTION not in text:
        return {}
    body = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in body.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        m = re.fullmatch(r"`([\w.]+)`", cells[0]) if len(cells) >= 3 else None
        if m:
            rows[m.group(1)] = cells[1:]
    return rows


def show(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, list):
        return "[" + ", ".join(map(str, value)) + "]"
    return str(value)


def test_the_key_list_is_the_release_file():
    keys = release_keys()
    assert len(keys) == len(set(keys)) == 139
    assert {"actor_rollout_ref.rollout.multi_turn.max_steps", "trainer.save_best_checkpoint",
            "actor_rollout_ref.actor.off_cliprange_high", "actor_rollout_ref.rollout.max_env_worker",
            "actor_rollout_ref.rollout.sparse", "env_service.env_url", "task_manager.n"} <= set(keys)


def test_every_release_key_is_mapped():
    rows = table_rows(PAPER_MAP.read_text(encoding="utf-8"))
    missing = [k for k in release_keys() if k not in rows]
    assert not missing, f"release keys with no row in docs/paper_map.md ({SECTION}): {missing}"
    unexplained = [k for k, (_, ours, note) in rows.items() if ours == "—" and not note]
    assert not unexplained, f"rows with no key of ours and no reason: {unexplained}"


def test_a_missing_row_is_detected():
    text = PAPER_MAP.read_text(encoding="utf-8")
    dropped = "\n".join(line for line in text.splitlines() if not line.startswith("| `env_service.env_url`"))
    assert "env_service.env_url" not in table_rows(dropped)
    assert table_rows(text.replace(SECTION, "## Something else")) == {}


@pytest.fixture(scope="module")
def composed():
    return OmegaConf.to_container(compose_config("exp/SEAL.yaml", check=False), resolve=True)


def test_named_keys_hold_the_stated_values(composed):
    cfg = OmegaConf.create(composed)
    checked = 0
    for release_key, (_, ours, _) in table_rows(PAPER_MAP.read_text(encoding="utf-8")).items():
        m = OURS.match(ours)
        if not m:
            continue
        key = m.group("key") or release_key
        actual = OmegaConf.select(cfg, key, default="<missing>")
        if OmegaConf.is_config(actual):
            actual = OmegaConf.to_container(actual)
        assert actual != "<missing>", f"{release_key}: our key {key} does not exist in exp/SEAL.yaml"
        assert show(actual) == m.group("value"), f"{release_key}: {key} is {show(actual)}, the table says {m.group('value')}"
        checked += 1
    assert checked >= 100
