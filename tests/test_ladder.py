"""`simdist-ladder` and the episode store: the pre-registered rule and what the ladder keeps.

The rule is checked on constructed cells (what it would choose, and when it refuses to choose);
the command runs on a small random Go2 model, is killed and resumed, and writes every cell.
"""

import json
import math
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from simdist_adapter.episodes import (
    SELECTION_SEED,
    Episode,
    EpisodePool,
    EpisodeStore,
    check_seeds,
    weights_digest,
)
from simdist_adapter.ladder import cell_key, format_table, main, select_friction
from simdist_adapter.registry import ModelRegistry
from simdist_planner.model.checkpoint import save_checkpoint
from test_adapter import small_model


def cells(rows: dict, label: str = "planner", speed: float = 0.3) -> dict:
    """{friction: successes of 5} -> ladder cells."""
    out = {}
    for f, crossed in rows.items():
        success = [True] * crossed + [False] * (5 - crossed)
        out[cell_key(label, f, speed)] = {
            "agent": label,
            "friction": f,
            "speed": speed,
            "seeds": list(range(SELECTION_SEED, SELECTION_SEED + 5)),
            "success": success,
            "distance": [1.82 if s else 1.2 for s in success],
            "steps": [300] * 5,
            "errors": 0,
        }
    return out


def test_the_rule_picks_the_highest_friction_with_at_most_two_of_five():
    ladder = cells({0.15: 5, 0.14: 3, 0.13: 2, 0.12: 0, 0.11: 0})
    friction, why = select_friction(ladder)
    assert friction == 0.13 and "2 / 5" in why
    # exactly 40 % qualifies, 60 % does not
    assert select_friction(cells({0.15: 3, 0.14: 2, 0.13: 0, 0.12: 0, 0.11: 0}))[0] == 0.14
    # a monotone ladder is not assumed: the first qualifying rung from the top wins
    assert select_friction(cells({0.15: 5, 0.14: 1, 0.13: 4, 0.12: 0, 0.11: 0}))[0] == 0.14


def test_the_rule_waits_for_every_higher_rung_and_reads_only_the_planner_at_its_speed():
    friction, why = select_friction(cells({0.14: 0, 0.13: 0}))
    assert friction is None and "0.15" in why  # the top rung is not measured yet
    partial = cells({0.15: 5, 0.14: 0})
    key = cell_key("planner", 0.14, 0.3)
    partial[key]["success"] = partial[key]["success"][:3]
    assert select_friction(partial)[0] is None  # 3 of 5 episodes are not a measurement
    # pi's cells and another speed's cells do not count for the rule
    other = {**cells({f: 0 for f in (0.15, 0.14)}, "policy"), **cells({0.15: 0}, speed=0.5)}
    assert select_friction(other)[0] is None
    friction, why = select_friction(cells({0.15: 5, 0.14: 5, 0.13: 4, 0.12: 3, 0.11: 3}))
    assert friction is None and "no rung" in why


def test_the_table_holds_every_cell_measured():
    table = format_table({**cells({0.15: 5, 0.12: 1}), **cells({0.15: 4}, "policy", 0.1)})
    lines = table.splitlines()
    assert lines[0] == "| panel friction | 0.1 m/s | 0.3 m/s |"
    assert lines[2].startswith("| 0.15 | pi 4/5") and "planner 5/5 (1.82 m)" in lines[2]
    assert lines[3] == "| 0.12 | - | planner 1/5 (1.32 m) |"


def test_the_store_gives_back_a_recorded_episode_exactly(tmp_path):
    rng = np.random.default_rng(0)
    rows = [
        {"proprio": rng.normal(size=35).astype(np.float32), "command": np.ones(3, np.float32)}
        for _ in range(4)
    ]
    ep = Episode(True, 1.82, 3, "", -0.5, rows, [rng.normal(size=12).astype(np.float32)] * 3)
    ep.values = [0.1, 0.2, float("nan")]
    store = EpisodeStore(tmp_path)
    key = store.key({"seed": 1})
    assert store.load(key) is None
    store.save(key, ep, {"seed": 1})
    back = store.load(key)
    assert (back.success, back.distance, back.steps, back.episode_return) == (True, 1.82, 3, -0.5)
    assert back.values[:2] == [0.1, 0.2] and math.isnan(back.values[2])
    assert len(back.rows) == 4 and all(
        np.array_equal(a[k], b[k]) for a, b in zip(rows, back.rows) for k in a
    )
    assert np.array_equal(np.stack(back.actions), np.stack(ep.actions))
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{key}.json", f"{key}.npz"]
    assert store.key({"seed": 1}) != store.key({"seed": 2})


@pytest.mark.slow  # runs the ladder command twice
@pytest.mark.timeout(300)
def test_the_ladder_command_resumes_and_keeps_every_cell(tmp_path, capsys):
    ck = save_checkpoint(small_model(), tmp_path / "ck")
    out = tmp_path / "ladder"
    argv = ["--checkpoint", str(ck), "--out", str(out), "--episodes", "2", "--samples", "8"]
    argv += ["--iterations", "1", "--elites", "2", "--frictions", "0.15,0.12"]
    main([*argv, "--speeds", "0.5", "--agents", "policy,planner"])
    stored = sorted(p.name for p in (out / "episodes").iterdir())
    assert len(stored) == 8  # 2 agents x 2 frictions x 2 seeds, none recorded
    main([*argv, "--speeds", "0.5", "--agents", "planner"])  # all read back, nothing runs
    assert sorted(p.name for p in (out / "episodes").iterdir()) == stored
    printed = capsys.readouterr().out
    assert "selected stand-in: undecided (friction 0.15 at 0.3 m/s has 0 of 5 episodes)" in printed
    saved = json.loads((out / "ladder.json").read_text())
    assert len(saved) == 4 and all(len(c["success"]) == 2 for c in saved.values())
    assert {c["agent"] for c in saved.values()} == {"policy", "planner"}
    assert saved[cell_key("planner", 0.12, 0.5)]["planner"]["num_samples"] == 8


def test_a_pool_needs_at_least_one_worker(tmp_path):
    """--workers 0 is refused before any task or model loads, with the reason."""
    with pytest.raises(ValueError, match="workers must be >= 1"):
        EpisodePool("go2_slope", {}, "cpu", {}, 0)


def test_a_worker_dies_with_the_process_that_spawned_it(tmp_path):
    """A killed experiment must not leave its workers running episodes nobody will read."""
    pid_file = tmp_path / "worker.pid"
    script = (
        "import multiprocessing as mp, sys, time\n"
        "def work(path):\n"
        "    from simdist_adapter.episodes import _die_with_parent\n"
        "    import os, pathlib\n"
        "    _die_with_parent()\n"
        "    pathlib.Path(path).write_text(str(os.getpid()))\n"
        "    time.sleep(120)\n"
        "if __name__ == '__main__':\n"
        "    mp.get_context('spawn').Process(target=work, args=(sys.argv[1],)).start()\n"
        "    time.sleep(120)\n"
    )
    (tmp_path / "parent.py").write_text(script)
    parent = subprocess.Popen([sys.executable, str(tmp_path / "parent.py"), str(pid_file)])
    try:
        deadline = time.monotonic() + 60
        while not pid_file.is_file() or not pid_file.read_text():
            assert time.monotonic() < deadline and parent.poll() is None
            time.sleep(0.05)
        worker = int(pid_file.read_text())
        assert pathlib.Path(f"/proc/{worker}").exists()
    finally:
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
    deadline = time.monotonic() + 10
    while _alive(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(worker)


def _alive(pid: int) -> bool:
    """Running (a zombie awaiting its reaper counts as ended)."""
    try:
        state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_an_episode_key_names_the_weights_not_the_file(tmp_path):
    """A registry's v0000 is the pretrained model saved again: the same weights, so the same
    episodes (a refused candidate's evaluation is read back, not run); other weights differ."""
    model = small_model()
    pretrained = save_checkpoint(model, tmp_path / "pretrained")
    registry = ModelRegistry(tmp_path / "registry")
    registry.init_from(pretrained)
    assert weights_digest(registry.deployed_path()) == weights_digest(pretrained)
    with torch.no_grad():
        next(model.f.parameters()).view(-1)[0] += 1e-6
    assert weights_digest(save_checkpoint(model, tmp_path / "other")) != weights_digest(pretrained)


@pytest.mark.timeout(300)
def test_a_cell_measured_with_another_setting_is_refused_not_mixed(tmp_path, capsys):
    """Ladder cells are keyed by label, friction and speed: a rerun with another planner setting
    (here the precision and the replan period) under the same label is refused with the reason;
    under its own label it gets its own cells."""
    ck = save_checkpoint(small_model(), tmp_path / "ck")
    out = tmp_path / "ladder"
    argv = ["--checkpoint", str(ck), "--out", str(out), "--episodes", "1", "--samples", "8"]
    argv += ["--iterations", "1", "--elites", "2", "--frictions", "0.12", "--speeds", "0.5"]
    argv += ["--agents", "planner"]
    main(argv)
    first = json.loads((out / "ladder.json").read_text())
    with pytest.raises(SystemExit, match="measured with another setting"):
        main([*argv, "--replan-period", "2"])
    assert json.loads((out / "ladder.json").read_text()) == first
    main([*argv, "--replan-period", "2", "--label", "replan2"])
    cells = json.loads((out / "ladder.json").read_text())
    assert set(cells) == {cell_key("planner", 0.12, 0.5), cell_key("replan2", 0.12, 0.5)}
    assert (
        cells[cell_key("planner", 0.12, 0.5)]["setting"]
        != cells[cell_key("replan2", 0.12, 0.5)]["setting"]
    )
    assert (out / ".gitignore").read_text() == ".*\n!.gitignore\n"


def test_selection_seeds_that_would_run_into_another_range_are_refused(tmp_path):
    check_seeds("selection", 10**6, "--episodes")  # the last range: nothing above it
    with pytest.raises(ValueError, match="run into the collection seeds"):
        check_seeds("evaluation", 100_001, "--eval-episodes")
