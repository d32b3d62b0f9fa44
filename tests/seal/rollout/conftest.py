"""Fixtures of the rollout tests: the real SmolLM2 tokenizer and a scripted token-level server."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

MODEL_DIR = Path(__file__).resolve().parents[3] / "models" / "SmolLM2-135M-Instruct"


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    if not (MODEL_DIR / "tokenizer.json").is_file():
        pytest.skip("models/SmolLM2-135M-Instruct is missing; run install.sh")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(MODEL_DIR)


@pytest.fixture(scope="module")
def env_client() -> Any:
    """The real environment client, with its own in-process service."""
    from env_service.client import EnvClient

    client = EnvClient.in_process()
    yield client
    client.close()


@pytest.fixture(scope="session")
def eos_id() -> int:
    """The end-of-message id SmolLM2 generates (its generation config's eos_token_id)."""
    import json

    return int(json.loads((MODEL_DIR / "generation_config.json").read_text())["eos_token_id"])


class LLMFailure(Exception):
    """Raised by :class:`ScriptedServer` for a scripted failing call."""


class ScriptedServer:
    """A fake token-level ``server_manager``: each call returns the next scripted completion.

    A script item is a string (encoded and followed by EOS, as a model would write it), a
    ``("cut", text)`` pair (no EOS: stopped by the length limit), ``"<FAIL>"`` (raise) or
    ``"<ABORT>"`` (an aborted generation). When the script runs out, ``default`` repeats.
    Every call's prompt ids and sampling params are recorded.
    """

    def __init__(self, tokenizer: Any, eos_id: int, script: Sequence[Any], default: Any = None) -> None:
        self.tokenizer = tokenizer
        self.eos_id = eos_id
        self.script = list(script)
        self.default = default
        self.calls: list[dict[str, Any]] = []
        self.outputs: list[list[int]] = []

    async def generate(self, request_id: str, prompt_ids: list[int], sampling_params: dict, **kw: Any) -> Any:
        from verl.workers.rollout.replica import TokenOutput

        self.calls.append({"prompt_ids": list(prompt_ids), "sampling_params": dict(sampling_params)})
        item = self.script.pop(0) if self.script else self.default
        if item is None:
            raise AssertionError("the scripted server ran out of completions")
        if item == "<FAIL>":
            raise LLMFailure("scripted server failure")
        if item == "<ABORT>":
            return TokenOutput(token_ids=[], log_probs=[], stop_reason="aborted")
        if isinstance(item, tuple):
            ids = self.tokenizer.encode(item[1], add_special_tokens=False)
            reason = "length"
        else:
            ids = self.tokenizer.encode(item, add_special_tokens=False) + [self.eos_id]
            reason = "completed"
        ids = ids[: int(sampling_params["max_tokens"])]
        self.outputs.append(ids)
        return TokenOutput(token_ids=ids, log_probs=[-0.5] * len(ids), stop_reason=reason)


@pytest.fixture()
def scripted_server(tokenizer: Any, eos_id: int) -> Any:
    def make(script: Sequence[Any], default: Any = None) -> ScriptedServer:
        return ScriptedServer(tokenizer, eos_id, script, default)

    return make
