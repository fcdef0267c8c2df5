"""simdist-pretrain killed mid-run and resumed ends with the weights of an uninterrupted run.

A small, fast version (a tiny synthetic Go2 model) of the kill-and-resume check: the run is a
real `simdist-pretrain` process, killed with SIGKILL once it has saved a train state, then
resumed in this process and compared tensor by tensor with a run that was never interrupted.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from simdist_planner.cli.pretrain import parse_args
from simdist_planner.model.checkpoint import load_checkpoint
from simdist_planner.training.loop import pretrain

STEPS = 30


def flags(out) -> list[str]:
    return [
        "--synthetic", "true",
        "--model", "go2",
        "--model-overrides", json.dumps({"latent_dim": 16, "history": 3, "horizon": 4}),
        "--steps", str(STEPS),
        "--batch-size", "4",
        "--warmup-steps", "3",
        "--checkpoint-every", "2",
        "--log-every", "2",
        "--workers", "0",
        "--out", str(out),
        "--no-progress",
    ]  # fmt: skip


def saved_step(state) -> int:
    """The step of the train state on disk; -1 while there is none (or it is being written)."""
    try:
        return int(json.loads(state.read_text())["step"])
    except (FileNotFoundError, ValueError, KeyError):
        return -1


# slow: test_pretrain.py::test_kill_and_resume_gives_the_weights_of_an_uninterrupted_run checks
# the same in make test
@pytest.mark.slow
def test_killed_pretraining_resumes_to_the_uninterrupted_weights(tmp_path):
    killed = tmp_path / "killed"
    proc = subprocess.Popen(
        [sys.executable, "-m", "simdist_planner.cli.pretrain", *flags(killed)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    state = killed / "train_state" / "state.json"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None and saved_step(state) < 2:
        time.sleep(0.005)
    alive = proc.poll() is None
    proc.send_signal(signal.SIGKILL)
    _, err = proc.communicate(timeout=30)
    assert alive and proc.returncode == -signal.SIGKILL, err[-2000:]
    killed_at = saved_step(state)
    # killed mid-run: a train state saved, the run not finished
    assert 2 <= killed_at < STEPS and not (killed / "model").exists(), killed_at
    at_kill = load_checkpoint(killed / "train_state" / "model").state_dict()

    cfg, _ = parse_args(flags(killed))
    resumed = pretrain(cfg, killed, progress=False)
    metrics = json.loads((resumed / "metrics.json").read_text())
    assert metrics["step"] == STEPS and metrics["steps_this_run"] == STEPS - killed_at

    straight_cfg, _ = parse_args(flags(tmp_path / "straight"))
    straight = pretrain(straight_cfg, tmp_path / "straight", progress=False)
    a, b = load_checkpoint(resumed).state_dict(), load_checkpoint(straight).state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    # the resumed run trained on from the kill: its weights moved from the saved ones
    assert any(not torch.equal(at_kill[k], a[k]) for k in a)
