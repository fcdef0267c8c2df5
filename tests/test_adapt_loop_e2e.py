"""End to end, Algorithm 1 through the ROS graph.

Slippery Slope in lockstep, recorder, adapter, hot swap.

A tiny loop of `make demo`: two recorded zero-shot episodes, an automatic adaptation round on
their bags in the adapter's worker process, the gate, the planner hot swap, then episodes with
the adapted model. A small randomly initialised Go2 model keeps it CPU-cheap.
"""

import json

import pytest

from simdist_adapter.bags import EpisodeBag, list_episode_bags
from simdist_adapter.demo import run_graph
from simdist_adapter.registry import ModelRegistry
from simdist_planner.model.checkpoint import save_checkpoint
from test_adapter import small_model

TINY = {
    "mujoco_driver": {"max_steps": 25},
    "planner": {"num_samples": 16, "iterations": 1, "num_elites": 4, "horizon": 3},
    "adapter": {
        "batch_size": 16,
        "lr": 3e-3,
        "warmup_steps": 5,
        "max_steps": 40,
        "holdout": 0.5,
        "poll_period_s": 0.2,
    },
}


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_recorded_episodes_adapt_f_and_hot_swap_the_planner(tmp_path, ros_domain):
    checkpoint = save_checkpoint(small_model(), tmp_path / "pretrained")
    out = tmp_path / "loop"
    out.mkdir()
    watcher = run_graph(
        out, checkpoint, episodes=2, timeout_s=420, overrides=TINY, domain=str(ros_domain)
    )
    log = (out / "graph.log").read_text()

    assert len(watcher.results["zero_shot"]) >= 2, log[-3000:]
    deployed = [rd for rd in watcher.rounds if rd["state"] == "deployed"]
    assert deployed, f"no adaptation round deployed: {watcher.rounds}; {log[-3000:]}"
    rd = deployed[0]
    assert rd["heldout_candidate"] < rd["heldout_deployed"]
    assert watcher.swapped and len(watcher.results["adapted"]) >= 2, log[-3000:]

    registry = ModelRegistry(out / "registry")
    versions = [h["version"] for h in registry.history()]  # later rounds may deploy more
    assert versions[:2] == ["v0000", "v0001"] and versions == sorted(versions)
    bags = list_episode_bags(out / "bags")
    assert len(bags) >= 4
    with EpisodeBag(bags[0]) as bag:
        assert bag.meta.task == "slippery_slope" and bag.meta.complete
        assert (
            "/simdist/safe_command" in bag.topics and "/simdist/observation/proprio" in bag.topics
        )
    rounds = sorted((out / "adapt_work").glob("round*/d_real/shard-*.h5"))
    assert rounds, "the adapter built no D_real"
    assert (
        json.loads((out / "registry" / "history.json").read_text())[-1]["metrics"]["episodes"] >= 2
    )
