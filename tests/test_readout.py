"""simdist-readout: the state head's error on held-out windows tells a latent that holds the task
state from a blind one, and pi's error against the expert tells a pi that follows it from one
that acts the mean, overall and per task phase."""

import numpy as np
import pytest

import toy_task
from robot_drivers import registry
from simdist_planner.cli.readout import main
from simdist_planner.data.reader import ShardedDataset
from simdist_planner.evaluation import datagen
from simdist_planner.evaluation.readout import (
    format_policy_readout,
    format_readout,
    policy_readout,
    state_readout,
)
from simdist_planner.model.checkpoint import load_checkpoint
from simdist_planner.training.config import PretrainConfig
from simdist_planner.training.loop import pretrain


@pytest.fixture(autouse=True)
def toy(monkeypatch):
    monkeypatch.setitem(registry.TASKS, "toy", toy_task.ENTRY)
    monkeypatch.setitem(datagen.ROBOT_DATA_CONFIGS, "toy", toy_task.robot_data_config)


def _toy_data(path, seed, **kw):
    cfg = datagen.GenerateConfig(
        task="toy",
        robot=toy_task.robot_data_config(None),
        episodes=10,
        seed=seed,
        task_overrides={"cameras": ()},
        **kw,
    )
    datagen.generate(cfg, path, progress=False)
    return ShardedDataset(path)


def _pretrain(tmp_path, name, state_weight, steps, data="train"):
    cfg = PretrainConfig.from_flat(
        dict(
            model="go2",
            data=(str(tmp_path / data),),
            steps=steps,
            batch_size=32,
            warmup_steps=5,
            checkpoint_every=steps,
            workers=0,
            learning_rate=2e-3,
            end_learning_rate=1e-3,
            model_overrides={
                "latent_dim": 16,
                "history": 2,
                "horizon": 3,
                "loss": {"state": state_weight},
            },
        )
    )
    return load_checkpoint(pretrain(cfg, tmp_path / name, progress=False))


@pytest.mark.slow  # trains two readouts on generated episodes (about a minute)
def test_readout_tells_a_latent_that_holds_the_state_from_an_untrained_one(
    tmp_path, capsys, monkeypatch
):
    # a phase for the toy task: each episode's first five steps
    monkeypatch.setattr(
        toy_task,
        "step_phases",
        lambda rows: {"start": np.arange(len(rows["action"])) < 5},
        raising=False,
    )
    _toy_data(tmp_path / "train", seed=0)
    held_out = _toy_data(tmp_path / "held_out", seed=1)  # other goals and starts
    trained = _pretrain(tmp_path, "trained", 4.0, 300)
    untrained = _pretrain(tmp_path, "untrained", 4.0, 1)
    good, good_start = state_readout(trained, held_out, windows=256)
    bad, _ = state_readout(untrained, held_out, windows=256)
    assert good.term == bad.term == "goal_offset"  # the toy's state: goal minus position
    assert (good.phase, good_start.phase) == ("all", "start")
    assert 0 < good_start.windows < good.windows and good_start.error < 0.5 * good_start.blind
    # the blind error is the data's own spread about its mean: the same for both models
    assert good.blind == pytest.approx(bad.blind) and good.blind > 0.1
    assert good.error < 0.5 * good.blind and good.error_large < 0.5 * good.blind_large
    assert bad.error > 0.8 * bad.blind
    assert "goal_offset" in format_readout([good], "t")
    with pytest.raises(ValueError, match="no state head"):
        state_readout(_pretrain(tmp_path, "no_head", 0.0, 1), held_out)

    with pytest.raises(ValueError, match="no window of the data starts with a clean expert action"):
        policy_readout(trained, _toy_data(tmp_path / "rungs", seed=3, expert_prob=0.0))
    with pytest.raises(ValueError, match="windows must be >= 1"):
        policy_readout(trained, held_out, windows=0)
    _toy_data(tmp_path / "expert_train", seed=4, expert_only=True)  # every action a target for pi
    expert_runs = _toy_data(tmp_path / "expert", seed=2, expert_only=True)
    imitator = _pretrain(tmp_path, "imitator", 4.0, 300, data="expert_train")
    every, start = policy_readout(imitator, expert_runs, windows=256)
    assert (every.phase, start.phase) == (
        "all",
        "start",
    ) and 0 < start.windows < every.windows <= 256
    naive = policy_readout(untrained, expert_runs, windows=256)[0]
    assert every.blind == pytest.approx(naive.blind)
    assert (
        max(e / b for e, b in zip(every.error, every.blind)) < 0.7
    )  # pi follows the expert (0.49 / 0.54)
    assert (
        min(e / b for e, b in zip(naive.error, naive.blind)) > 0.85
    )  # an untrained pi does not (1.20 / 0.95)
    assert "start" in format_policy_readout([every, start], "t")

    assert (
        main(
            [
                "--checkpoint",
                str(tmp_path / "trained" / "model"),
                "--data",
                str(tmp_path / "held_out"),
                "--windows",
                "64",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "goal_offset" in out and "pi's first action" in out
