"""verl's V1 trainer training for real on CPU: two FSDP ranks on a two-node Ray cluster, an exact
resume, and the faults a long run meets, in two launches of ``launcher.py --conf exp/verl_cpu.yaml``.

The cluster is two raylets on this machine (``ray.cluster_utils.Cluster``), each offering one
process slot (``seal_cpu_slot``), so verl's two per-node placement groups land on distinct nodes.
The policy is the quickstart's warm-started SmolLM2 (install.sh builds it), so rewards differ
within groups and every step's update is a real one.

1. ``straight`` (a module fixture): two steps. At each: a group with reward spread, non-zero
   advantages, a positive gradient norm, moved weights (the sharded checkpoints), and the rollout
   servers sampling with the actor's weights (verl's rollout-vs-actor log-prob difference).
2. ``resumed``: a copy of ``straight`` cut back to its checkpoint 1 (a trained update), resumed with
   ``trainer.resume_mode=auto``. Its step 2 must equal the straight run's: the same metrics, the
   same weights and optimizer state (to ``ATOL``), the same SEAL state. Then the environment
   service is killed (step 3's episodes are faults: excluded, counted, no update), then an actor
   worker (the run stops with one line naming the checkpoint to continue from).
3. With ``--run-sabotage``: the same resume from a checkpoint whose optimizer state, or whose
   capability state, is what a resume that skipped restoring it would hold; the comparison of 2
   must then name that difference.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from test_gpu_smoke import MODEL_DIR, _free_port

ROOT = Path(__file__).resolve().parents[1]
SLOT = "seal_cpu_slot"
STEPS = (1, 2)
# One task a step (notes_040, which the warm start passes about a third of the time), n = 4.
TASK_OVERRIDES = ("seal.tasks.max_train_tasks=1", "data.train_batch_size=1", "actor_rollout_ref.actor.ppo_mini_batch_size=1")
EPISODES_PER_STEP = 4.0
# fp32 on CPU, the same inputs: a resumed step differs from the straight one only by the order in
# which verl's data-parallel partitions sum the gradients (episodes of equal length may swap ranks).
ATOL = 1e-6
# Metrics that measure the machine, not the training; and verl's per-rank token counts of the batch
# as it arrived, before balancing (the order in which the episodes finished).
VOLATILE = ("timing_s/", "timing_per_token_ms/", "perf/", "actor/perf/", "throughput", "seal/time", "time/",
            "global_seqlen/min", "global_seqlen/max", "global_seqlen/minmax_diff")


def _launch(cwd: Path, name: str, cluster_address: str, port: int, log: Path, *overrides: str) -> subprocess.Popen:
    # verl's file logger writes each step's metrics from the trainer, a Ray actor: the path reaches
    # it through the job's runtime env (the raylets were started by this test process).
    metrics = f"+ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH={log.with_suffix('.jsonl')}"
    cmd = [sys.executable, str(ROOT / "launcher.py"), "--conf", str(ROOT / "exp" / "verl_cpu.yaml"), "--with-env",
           "--", f"trainer.experiment_name={name}", f"ray_kwargs.ray_init.address={cluster_address}", metrics,
           "trainer.nnodes=2", f"env_service.url=http://127.0.0.1:{port}", "trainer.logger=[console,file]",
           "trainer.val_before_train=false", "trainer.test_freq=0", "seal.rollout.env_retries=0", *TASK_OVERRIDES,
           *overrides]
    return subprocess.Popen(cmd, cwd=cwd, stdout=log.open("w"), stderr=subprocess.STDOUT)


def _steps(log: Path) -> dict[int, dict[str, float]]:
    path = log.with_suffix(".jsonl")
    finished = path.read_text().split("\n")[:-1] if path.is_file() else []  # a line being written is not yet one
    return {int(r["step"]): r["data"] for r in (json.loads(line) for line in finished if line.strip())}


def _wait_for(condition, proc: subprocess.Popen, what: str, timeout: float = 1800) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"the run ended before {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def _kill_matching(run: subprocess.Popen, marker: str) -> None:
    procs = [p for p in psutil.Process(run.pid).children(recursive=True) if _cmdline_has(p, marker)]
    assert procs, f"no process of this run matches {marker!r}"
    for proc in [c for p in procs for c in p.children(recursive=True)] + procs:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass


def _cmdline_has(proc: psutil.Process, marker: str) -> bool:
    try:
        return marker in " ".join(proc.cmdline())
    except psutil.Error:
        return False


def _kill_actor_worker() -> None:
    """SIGKILL one of verl's FSDP worker processes: Ray actors live under the raylets, which this
    test process started (never another run's)."""
    for proc in psutil.Process().children(recursive=True):
        if _cmdline_has(proc, "ray::WorkerDict"):
            proc.kill()
            return
    raise AssertionError("no verl worker process of this test's cluster to kill")


def _stop(run: subprocess.Popen) -> None:
    if run.poll() is None:
        for proc in psutil.Process(run.pid).children(recursive=True) + [psutil.Process(run.pid)]:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        run.wait(timeout=60)


def _shards(folder: Path, kind: str) -> list[dict]:
    files = [folder / "actor" / f"{kind}_world_size_2_rank_{rank}.pt" for rank in (0, 1)]
    assert all(f.is_file() for f in files), f"{folder}: {sorted(p.name for p in (folder / 'actor').iterdir())}"
    return [torch.load(f, map_location="cpu", weights_only=False) for f in files]


def _local(value):
    return value.to_local() if hasattr(value, "to_local") else value


def _weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    """The full actor weights of a two-rank sharded checkpoint (FSDP2 shards dim 0)."""
    ranks = _shards(checkpoint, "model")
    return {k: torch.cat([_local(r[k]) for r in ranks]) for k in ranks[0]}


def _tensors(obj, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every tensor inside a (nested) optimizer state, by path."""
    if isinstance(obj, dict):
        return {k: v for key, val in obj.items() for k, v in _tensors(val, f"{prefix}/{key}").items()}
    if isinstance(obj, (list, tuple)):
        return {k: v for i, val in enumerate(obj) for k, v in _tensors(val, f"{prefix}/{i}").items()}
    value = _local(obj)
    return {prefix: value.float()} if isinstance(value, torch.Tensor) else {}


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def _initial_weights(exp: Path) -> dict[str, torch.Tensor]:
    """The weights the run started from (the warm-started checkpoint its config names)."""
    from omegaconf import OmegaConf
    from safetensors.torch import load_file

    model = Path(str(OmegaConf.load(exp / "config.yaml").actor_rollout_ref.model.path))
    return load_file(str(model / "model.safetensors"))


def _worker_nodes(cluster_address: str) -> set[str]:
    import ray
    from ray.util.state import list_actors

    ray.init(address=cluster_address, logging_level="ERROR")
    try:
        return {a.node_id for a in list_actors(limit=1000, detail=True) if "WorkerDict" in a.class_name}
    finally:
        ray.shutdown()


def _cut_back_to(src: Path, dst: Path, step: int) -> None:
    """``dst``: a copy of the experiment ``src`` as it stood when checkpoint ``step`` was written."""
    shutil.copytree(src, dst)
    ckpts = dst / "checkpoints"
    for folder in ckpts.glob("global_step_*"):
        if int(folder.name.rsplit("_", 1)[1]) > step:
            shutil.rmtree(folder)
    (ckpts / "latest_checkpointed_iteration.txt").write_text(str(step))
    shutil.copytree(ckpts / f"global_step_{step}" / "seal", dst / "diagnostic_state", dirs_exist_ok=True)


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    if not (MODEL_DIR / "tokenizer.json").is_file():
        pytest.skip("models/SmolLM2-135M-Instruct is not installed (run install.sh)")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 8, "resources": {SLOT: 1}})
    cluster.add_node(num_cpus=4, resources={SLOT: 1})
    yield cluster
    cluster.shutdown()


@pytest.fixture(scope="module")
def straight(cluster, tmp_path_factory) -> tuple[Path, dict[int, dict[str, float]]]:
    """Two steps from the warm start, straight through: the experiments folder and each step's metrics."""
    root = tmp_path_factory.mktemp("verl_runs")
    log = root / "straight.log"
    run = _launch(root, "straight", cluster.address, _free_port(), log, "trainer.total_training_steps=2")
    try:
        run.wait(timeout=2400)
    finally:
        _stop(run)
    out = log.read_text()
    assert run.returncode == 0, out[-4000:]
    assert "Connected to Ray cluster" in out and "verl on the CPU platform" in out
    metrics = _steps(log)
    assert sorted(metrics) == list(STEPS), sorted(metrics)
    return root / "experiments", metrics


@pytest.mark.slow
@pytest.mark.ray
def test_every_step_trains_on_two_ranks_on_two_nodes(cluster, straight) -> None:
    exps, metrics = straight
    assert len(_worker_nodes(cluster.address)) == 2  # one rank a node, each writing its own shard
    weights = {0: _initial_weights(exps / "straight")}
    for k in STEPS:
        m = metrics[k]
        assert m["seal/groups_with_reward_spread"] >= 1, (k, m["seal/reward_mean"])
        assert m["seal/nonzero_advantage_rows"] >= 1 and m["seal/skipped_updates"] == 0, k
        assert m["actor/grad_norm"] > 0, k
        # The servers sampled with the weights the actor computes its log-probs with: after an
        # update, a server left with the old weights would differ by the update's effect.
        assert m["training/rollout_probs_diff_max"] < 1e-3, (k, m["training/rollout_probs_diff_max"])
        weights[k] = _weights(exps / "straight" / "checkpoints" / f"global_step_{k}")
        # The initial checkpoint does not store the LM head tied to the embeddings; verl's does.
        common = weights[k].keys() & weights[k - 1].keys()
        assert len(common) >= len(weights[k]) - 1, sorted(weights[k].keys() ^ weights[k - 1].keys())
        moved = _max_diff({n: weights[k][n] for n in common}, {n: weights[k - 1][n] for n in common})
        assert moved > 1e-5, f"step {k} did not move the weights (max change {moved})"


def _resume(cluster, straight, tmp_path: Path, *overrides: str, damage=None, faults: bool = False):
    """Resume a copy of the straight run cut back to checkpoint 1 (``damage`` applied to it first);
    with ``faults``, kill the environment service once step 2 is logged and an actor worker once
    step 3 is. Returns the process, its metrics and its experiment folder."""
    exps, _ = straight
    exp = tmp_path / "experiments" / "resumed"
    _cut_back_to(exps / "straight", exp, step=1)
    if damage is not None:
        damage(exp / "checkpoints" / "global_step_1")
    log = tmp_path / "resumed.log"
    steps = 4 if faults else 2
    run = _launch(tmp_path, "resumed", cluster.address, _free_port(), log, f"trainer.total_training_steps={steps}",
                  "trainer.resume_mode=auto", *overrides)
    try:
        if faults:
            _wait_for(lambda: 2 in _steps(log), run, "the resumed step 2")
            _kill_matching(run, "-m env_service")  # step 3 plays against a dead service
            _wait_for(lambda: 3 in _steps(log), run, "step 3's metrics")
            _kill_actor_worker()
        run.wait(timeout=1800)
    finally:
        _stop(run)
    return run, log, exp


def resume_differences(straight, resumed_metrics: dict, resumed_exp: Path) -> list[str]:
    """What differs between the straight run's step 2 and the resumed one's: metrics, weights,
    optimizer state, SEAL state (empty when the resume is exact)."""
    exps, metrics = straight
    found = []
    same = {k: v for k, v in metrics[2].items() if not k.startswith(VOLATILE)}
    for key, value in same.items():
        again = resumed_metrics.get(key)
        if again is None or abs(float(value) - float(again)) > 1e-4 * max(1.0, abs(float(value))):
            found.append(f"metric {key}: {value} then {again}")
    a, b = exps / "straight" / "checkpoints" / "global_step_2", resumed_exp / "checkpoints" / "global_step_2"
    if (diff := _max_diff(_weights(a), _weights(b))) > ATOL:
        found.append(f"weights differ by {diff}")
    optims = [_tensors([shard["state"] for shard in _shards(c, "optim")]) for c in (a, b)]
    if (diff := _max_diff(*optims)) > ATOL:
        found.append(f"optimizer state differs by {diff}")
    for name in ("capability_state.json", "seal_hooks.json"):
        if json.loads((a / "seal" / name).read_text()) != json.loads((b / "seal" / name).read_text()):
            found.append(f"seal state {name} differs")
    return found


@pytest.mark.slow
@pytest.mark.ray
def test_a_resume_repeats_the_step_exactly_then_meets_the_faults(cluster, straight, tmp_path: Path) -> None:
    run, log, exp = _resume(cluster, straight, tmp_path, faults=True)
    out = log.read_text()
    second = _steps(log)
    assert sorted(second) == [2, 3], (sorted(second), out[-3000:])
    assert json.loads((exp / "resumes.jsonl").read_text().splitlines()[-1])["resumed_from"] == 1
    assert resume_differences(straight, second[2], exp) == []

    # Step 3's episodes are faults: excluded and counted, no update, nothing observed. Then the
    # killed worker stops the run in one line naming the checkpoint to continue from.
    assert second[3]["seal/env_faults"] == second[3]["seal/episodes"] == EPISODES_PER_STEP
    assert second[3]["seal/skipped_updates"] == 1.0
    observed = [json.loads((exp / "checkpoints" / f"global_step_{k}" / "seal" / "capability_state.json")
                           .read_text())["observe_count"] for k in (2, 3)]
    assert observed[0] == observed[1] > 0
    assert run.returncode == 1, out[-4000:]
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: the verl run stopped:"), out[-3000:]
    assert "continue from checkpoint step 3 with trainer.resume_mode=auto" in errors[0]


def _fresh_optimizer(checkpoint: Path) -> None:
    """What a resume that skipped the optimizer would hold: AdamW's state as it starts."""
    for path in sorted(checkpoint.glob("actor/optim_world_size_2_rank_*.pt")):
        optim = torch.load(path, map_location="cpu", weights_only=False)
        for state in optim["state"].values():
            for key, value in state.items():
                _local(value).zero_()
        torch.save(optim, path)


def _fresh_capability_state(checkpoint: Path) -> None:
    """What a resume that skipped the SEAL state would hold: an empty capability state and no
    A-Patch EMA."""
    from seal.diagnosis.state import CapabilityState

    (checkpoint / "seal" / "capability_state.json").write_text(json.dumps(CapabilityState().to_dict()))
    hooks = json.loads((checkpoint / "seal" / "seal_hooks.json").read_text())
    hooks["reweighter_state"] = {}
    (checkpoint / "seal" / "seal_hooks.json").write_text(json.dumps(hooks))


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.sabotage
@pytest.mark.parametrize("damage, expected", [(_fresh_optimizer, "optimizer state differs"),
                                              (_fresh_capability_state, "seal state capability_state.json differs")],
                         ids=["optimizer", "capability_state"])
def test_the_exact_resume_check_catches_a_lost_state(cluster, straight, tmp_path: Path, damage, expected) -> None:
    """The comparison of the test above fails when the resumed run did not get the checkpoint's
    optimizer state, or its capability state (a proof of that test, run with --run-sabotage)."""
    run, log, exp = _resume(cluster, straight, tmp_path, damage=damage)
    assert run.returncode == 0, log.read_text()[-3000:]
    found = resume_differences(straight, _steps(log)[2], exp)
    assert any(line.startswith(expected) for line in found), found
