"""example.env lets the GPU recipe fetch its model; the CPU path stays offline without it.

Offline mode in example.env (copied to .env, which the launcher loads) stopped the GPU recipe from
downloading Qwen/Qwen2.5-7B-Instruct on first use. The CPU path does not need it: the local
backend loads the quickstart's model from a local folder, which is checked here in a fresh
process with the offline variables unset and every outgoing connection refused and recorded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from dotenv import dotenv_values

from seal.config import REPO_ROOT

OFFLINE_VARS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")

PROBE = r"""
import json, socket, sys
attempts = []
real_connect = socket.socket.connect

def refuse(self, address):
    if self.family in (socket.AF_INET, socket.AF_INET6):
        attempts.append(str(address))
        raise OSError("network disabled by the test")
    return real_connect(self, address)

socket.socket.connect = refuse
socket.create_connection = lambda address, *a, **k: (attempts.append(str(address)), (_ for _ in ()).throw(OSError("network disabled")))[1]

import torch
from seal.config import compose_config
from seal.trainer.local.policy import load_policy

cfg = compose_config("exp/quickstart_bfcl.yaml")
model, tok = load_policy(cfg, torch.device("cpu"))
ids = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
print(json.dumps({"attempts": attempts, "backend": str(cfg.trainer.backend), "params": sum(p.numel() for p in model.parameters())}))
"""


def test_example_env_leaves_hub_access_on():
    active = dotenv_values(REPO_ROOT / "example.env")
    assert not [v for v in OFFLINE_VARS if v in active], "example.env must not switch the GPU recipe offline"
    text = (REPO_ROOT / "example.env").read_text(encoding="utf-8")
    for var in OFFLINE_VARS:  # still documented, commented out
        assert f"# {var}=1" in text


def test_cpu_quickstart_loads_its_model_with_no_network():
    if not (REPO_ROOT / "models" / "SmolLM2-135M-Instruct" / "config.json").is_file():
        pytest.skip("models/SmolLM2-135M-Instruct is not installed (run install.sh)")
    env = {k: v for k, v in os.environ.items() if k not in OFFLINE_VARS}
    env["HF_ENDPOINT"] = "http://192.0.2.1:9"  # TEST-NET-1: never routable, in case a call slipped through
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["backend"] == "local" and result["params"] > 100_000_000
    assert result["attempts"] == []
