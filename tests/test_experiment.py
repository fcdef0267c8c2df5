"""`simdist-adapt-experiment`: the measured loop, in one process and in worker processes.

A small randomly initialised Go2 model on Slippery Slope keeps it CPU-cheap; what is checked is
the machinery: every figure lands in results.json, adaptation touches the registry, the shared
zero-shot evaluation, and that episodes in spawned workers reproduce the in-process run exactly.
"""

import json
import math

import pytest

from simdist_adapter.experiment import Experiment, ExperimentConfig, format_table, parse_args
from simdist_adapter.finetune import AdaptConfig
from simdist_planner.model.checkpoint import save_checkpoint
from test_adapter import small_model


def config(tmp_path, checkpoint, workers: int) -> ExperimentConfig:
    return ExperimentConfig(
        task="slippery_slope",
        checkpoint=str(checkpoint),
        out=str(tmp_path / f"w{workers}"),
        methods=("simdist", "unfreeze_encoder", "base_policy"),
        rounds=1,
        episodes_per_round=3,
        eval_episodes=2,
        max_steps=12,
        workers=workers,
        planner={"num_samples": 8, "iterations": 1, "num_elites": 2},
        adapt=AdaptConfig(batch_size=8, lr=1e-3, warmup_steps=2, max_steps=6, holdout=0.34),
    )


def figures(results: dict) -> dict:
    return {
        name: (
            r["curve"],
            [
                (rd["heldout_deployed"], rd["heldout_candidate"], rd["deployed"])
                for rd in r["rounds"]
            ],
        )
        for name, r in results["methods"].items()
    }


@pytest.mark.timeout(600)
def test_workers_reproduce_the_in_process_experiment(tmp_path):
    checkpoint = save_checkpoint(small_model(), tmp_path / "pretrained")
    one = Experiment(config(tmp_path, checkpoint, workers=1)).run()
    two = Experiment(config(tmp_path, checkpoint, workers=2)).run()
    assert figures(one) == figures(two)

    saved = json.loads((tmp_path / "w2" / "results.json").read_text())
    assert set(saved["methods"]) == {"simdist", "unfreeze_encoder", "base_policy"}
    simdist, encoder = saved["methods"]["simdist"], saved["methods"]["unfreeze_encoder"]
    assert [c["real_episodes"] for c in simdist["curve"]] == [0, 3]
    assert simdist["curve"][0] == encoder["curve"][0]  # one zero-shot evaluation serves both
    assert simdist["rounds"][0]["heldout_candidate"] is not None
    history = json.loads((tmp_path / "w2" / "simdist" / "registry" / "history.json").read_text())
    assert simdist["rounds"][0]["deployed"] and [h["version"] for h in history] == [
        "v0000",
        "v0001",
    ]
    assert history[-1]["metrics"]["episodes"] == 3 and history[-1]["metrics"]["transitions"] > 0
    assert all(c["errors"] == 0 for r in saved["methods"].values() for c in r["curve"])
    returns = [c["mean_return"] for r in saved["methods"].values() for c in r["curve"]]
    assert (
        all(math.isfinite(x) for x in returns) and len(set(returns)) > 1
    )  # summed per episode, not a constant
    assert len(saved["plots"]) >= 2 and "simdist" in format_table(saved)
    probe = saved["probe_trajectory"]  # the deployed round's predicted vs real trajectory
    assert set(probe["predicted"]) == {"pretrained", "adapted"}
    assert all(len(v) == len(probe["real"]) > 0 for v in probe["predicted"].values())
    assert any(p.endswith("predicted_vs_real_trajectory.png") for p in saved["plots"])


def test_cli_settings_reach_the_config():
    cfg = parse_args(
        [
            "--checkpoint",
            "ckpt",
            "--workers",
            "6",
            "--adapt-warmup",
            "50",
            "--samples",
            "64",
            "--methods",
            "simdist,base_policy",
        ]
    )
    assert cfg.workers == 6 and cfg.adapt.warmup_steps == 50 and cfg.planner == {"num_samples": 64}
    assert cfg.methods == ("simdist", "base_policy") and cfg.region is None
    # the same planner flags as simdist-eval, and the UR5e start region
    cfg = parse_args(
        [
            "--checkpoint",
            "ckpt",
            "--task",
            "peg",
            "--region",
            "narrow",
            "--mixture-coef",
            "0.5",
            "--policy-noise",
            "0.002",
            "--policy-prior",
            "200",
            "--warm-start",
            "policy",
        ]
    )
    assert cfg.region == "narrow" and cfg.planner == {
        "mixture_coef": 0.5,
        "policy_noise_std": 0.002,
        "policy_prior": 200.0,
        "warm_start": "policy",
    }
    with pytest.raises(ValueError, match="workers"):
        ExperimentConfig(checkpoint="ckpt", workers=0)
