"""Checkpoint selection: every kept checkpoint's pi scored on the same seeded episodes, the best
made the run's model bit for bit, a corrupt one skipped, nothing lost when none loads."""

import dataclasses
import json

import pytest
import torch

from robot_drivers.registry import make_task
from simdist_planner.cli.pretrain import main as pretrain_main
from simdist_planner.cli.pretrain import parse_args
from simdist_planner.cli.select_checkpoint import main
from simdist_planner.evaluation.agents import build_agents
from simdist_planner.evaluation.checkpoint_selection import (
    SelectionError,
    best_of,
    select_checkpoint,
)
from simdist_planner.evaluation.evaluate import evaluate, task_overrides
from simdist_planner.model.checkpoint import load_checkpoint, read_metrics, save_checkpoint
from simdist_planner.model.config import go2_config
from simdist_planner.model.world_model import WorldModel
from simdist_planner.training.config import CheckpointSelection

GO2 = CheckpointSelection(task="go2_flat", episodes=2, seed=7, max_steps=3)
TINY = {"latent_dim": 16, "history": 3, "horizon": 4}


def _go2_model(seed: int) -> WorldModel:
    torch.manual_seed(seed)
    return WorldModel(go2_config(**TINY)).eval()


def _pi_scores(path, selection: CheckpointSelection):
    """pi of one checkpoint through the evaluation's own public path (the reference)."""

    model = load_checkpoint(path)
    task = make_task(
        selection.task, **task_overrides(selection.task, None, selection.max_steps, model)
    )
    try:
        (s,) = evaluate(
            task,
            build_agents(["policy"], task, model),
            selection.episodes,
            selection.seed,
            progress=False,
        )
    finally:
        task.close()
    return s.success_rate, s.mean_return


def _same_weights(a, b) -> bool:
    sa, sb = load_checkpoint(a).state_dict(), load_checkpoint(b).state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_best_of_ranks_success_then_return_then_the_later_step():
    rows = [
        {"checkpoint": "a", "step": 1, "error": None, "success_rate": 0.5, "mean_return": 1.0},
        {"checkpoint": "b", "step": 2, "error": None, "success_rate": 0.4, "mean_return": 9.0},
        {"checkpoint": "c", "step": 3, "error": "corrupt"},
        {"checkpoint": "d", "step": 4, "error": None, "success_rate": 0.5, "mean_return": 2.0},
    ]
    assert best_of(rows)["checkpoint"] == "d"
    rows[0]["mean_return"] = 2.0  # a tie on both: the later step
    assert best_of(rows)["checkpoint"] == "d"
    rows[3]["success_rate"] = 0.1
    assert best_of(rows)["checkpoint"] == "a"
    with pytest.raises(SelectionError, match="no checkpoint could be scored: c: corrupt"):
        best_of([rows[2]])


@pytest.mark.slow  # scores several checkpoints on episodes; the selection rule's unit tests stay
def test_selection_scores_each_checkpoint_and_makes_the_best_the_model(tmp_path):
    run = tmp_path / "run"
    for step, seed in ((100, 1), (200, 2), (300, 3), (400, 4)):
        save_checkpoint(
            _go2_model(seed), run / "checkpoints" / f"step-{step:07d}", metrics={"step": step}
        )
    save_checkpoint(_go2_model(4), run / "model", metrics={"step": 400, "seconds_this_run": 12.0})
    corrupt = run / "checkpoints" / "step-0000300" / "model.safetensors"
    corrupt.write_bytes(corrupt.read_bytes()[:-64])  # truncated on disk
    expected = {
        step: _pi_scores(run / "checkpoints" / f"step-{step:07d}", GO2) for step in (100, 200, 400)
    }

    report = select_checkpoint(run, dataclasses.replace(GO2, workers=2), log=lambda _: None)

    rows = {r["step"]: r for r in report["checkpoints"]}
    assert sorted(rows) == [100, 200, 300, 400]
    assert "model.safetensors" in rows[300]["error"]  # skipped, named
    for step, (success, ret) in expected.items():  # the same seeded episodes as the evaluation's
        assert rows[step]["error"] is None and rows[step]["episodes"] == 2
        assert (rows[step]["success_rate"], rows[step]["mean_return"]) == pytest.approx(
            (success, ret)
        )
    best = max(expected, key=lambda s: (*expected[s], s))
    assert (
        len({ret for _, ret in expected.values()}) == 3
    )  # distinct models: the ranking means something
    assert report["selected_step"] == best
    assert _same_weights(run / "model", run / "checkpoints" / f"step-{best:07d}")
    metrics = read_metrics(run / "model")
    assert (
        metrics["selected_step"] == best
        and metrics["step"] == best
        and metrics["seconds_this_run"] == 12.0
    )
    assert json.loads((run / "selection.json").read_text()) == json.loads(json.dumps(report))
    assert not _same_weights(
        run / "checkpoints" / "step-0000100", run / "checkpoints" / "step-0000200"
    )


def test_nothing_to_score_is_an_error_that_leaves_the_model_alone(tmp_path):
    run = tmp_path / "run"
    with pytest.raises(SelectionError, match="holds no step-\\* checkpoints"):
        select_checkpoint(run, GO2, log=lambda _: None)
    save_checkpoint(_go2_model(1), run / "checkpoints" / "step-0000100")
    save_checkpoint(_go2_model(2), run / "model")
    (run / "checkpoints" / "step-0000100" / "config.json").write_text("{")
    before = (run / "model" / "model.safetensors").read_bytes()
    with pytest.raises(SelectionError, match="no checkpoint could be scored"):
        select_checkpoint(run, GO2, log=lambda _: None)
    assert (run / "model" / "model.safetensors").read_bytes() == before
    assert not (run / "selection.json").exists()


def test_pretraining_with_selection_ends_on_the_best_checkpoint(tmp_path):
    # simdist-pretrain trains, then scores the kept checkpoints and installs the best as model/
    flags = [
        "--model",
        "go2",
        "--synthetic",
        "true",
        "--model-overrides",
        json.dumps(TINY),
        "--steps",
        "8",
        "--batch-size",
        "4",
        "--warmup-steps",
        "2",
        "--checkpoint-every",
        "4",
        "--keep-checkpoints",
        "2",
        "--log-every",
        "4",
        "--workers",
        "0",
        "--no-progress",
        "--checkpoint-selection",
        json.dumps(dataclasses.asdict(GO2)),
    ]
    pretrain_main([*flags, "--out", str(tmp_path / "run")])
    final = tmp_path / "run" / "model"
    report = json.loads((tmp_path / "run" / "selection.json").read_text())
    assert [r["step"] for r in report["checkpoints"]] == [4, 8]
    assert _same_weights(
        final, tmp_path / "run" / "checkpoints" / f"step-{report['selected_step']:07d}"
    )
    assert (
        json.loads((tmp_path / "run" / "pretrain.json").read_text())["checkpoint_selection"]["task"]
        == "go2_flat"
    )

    # a task the model cannot drive fails before any training
    wrong = dataclasses.asdict(CheckpointSelection(task="peg", region="wide"))
    with pytest.raises(ValueError, match="proprio_dim"):
        pretrain_main([*flags[:-1], json.dumps(wrong), "--out", str(tmp_path / "wrong")])
    assert not (tmp_path / "wrong" / "train_state").exists()


def test_cli_sets_amends_and_clears_the_selection(tmp_path, capsys):
    cfg, _ = parse_args(
        [
            "--preset",
            "go2",
            "--synthetic",
            "true",
            "--out",
            "o",
            "--checkpoint-selection",
            '{"task": "go2_slope", "episodes": 5}',
        ]
    )
    assert cfg.checkpoint_selection == CheckpointSelection(task="go2_slope", episodes=5)
    cfg, _ = parse_args(
        [
            "--preset",
            "ur5e_peg",
            "--data",
            "d",
            "--out",
            "o",
            "--checkpoint-selection",
            '{"workers": 1}',
        ]
    )
    assert cfg.checkpoint_selection.task == "peg" and cfg.checkpoint_selection.workers == 1
    cfg, _ = parse_args(
        ["--preset", "ur5e_peg", "--data", "d", "--out", "o", "--checkpoint-selection", "null"]
    )
    assert cfg.checkpoint_selection is None
    with pytest.raises(SystemExit):
        parse_args(
            [
                "--preset",
                "ur5e_peg",
                "--data",
                "d",
                "--out",
                "o",
                "--checkpoint-selection",
                '{"task": ""}',
            ]
        )
    assert "give the task" in capsys.readouterr().err

    run = tmp_path / "run"
    save_checkpoint(_go2_model(1), run / "checkpoints" / "step-0000010")
    assert (
        main(["--run", str(run), "--task", "go2_flat", "--episodes", "1", "--max-steps", "2"]) == 0
    )
    assert "step 10 is" in capsys.readouterr().out
    assert _same_weights(run / "model", run / "checkpoints" / "step-0000010")
    with pytest.raises(SystemExit, match="episodes must be >= 1"):
        main(["--run", str(run), "--task", "go2_flat", "--episodes", "0"])
