"""`simdist-adapt-experiment`: the measured loop, in one process and in worker processes.

A small randomly initialised Go2 model on Slippery Slope keeps it CPU-cheap; what is checked is
the machinery: every figure lands in results.json, adaptation touches the registry, the shared
zero-shot evaluation, that episodes in spawned workers reproduce the in-process run exactly, and
that a killed run resumes from its output folder with the figures of an uninterrupted one.
"""

import dataclasses
import json
import math
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from simdist_adapter.episodes import Episode, EpisodeStore
from simdist_adapter.experiment import Experiment, ExperimentConfig, _score, parse_args
from simdist_adapter.finetune import AdaptConfig, real_windows
from simdist_adapter.results import format_table, run_summary
from simdist_planner.data.reader import ShardedDataset
from simdist_planner.model.checkpoint import save_checkpoint
from test_adapter import small_model


def config(tmp_path, checkpoint, workers: int, out: str = "", rounds: int = 1) -> ExperimentConfig:
    return ExperimentConfig(
        task="slippery_slope",
        checkpoint=str(checkpoint),
        out=str(tmp_path / (out or f"w{workers}")),
        methods=("simdist", "unfreeze_encoder", "base_policy"),
        rounds=rounds,
        episodes_per_round=3,
        eval_episodes=2,
        max_steps=12,
        speed=0.3,
        panel_friction=0.12,
        other_speeds=(0.5,),
        other_eval_episodes=1,
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


@pytest.mark.slow  # the experiment twice, in process and with workers
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
    zero = simdist["curve"][0]
    assert zero["episodes"] == 2 and set(zero["other_speeds"]) == {"0.5"}
    assert zero["other_speeds"]["0.5"]["episodes"] == 1 and zero["robot_minutes"] > 0
    assert zero["successes_per_minute"] == zero["successes"] / zero["robot_minutes"]
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
    assert len(saved["plots"]) >= 3 and "simdist" in format_table(saved)
    assert any(p.endswith("successes_per_minute.png") for p in saved["plots"])
    assert "0.5 m/s" in format_table(saved)
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


def _stored(out: pathlib.Path) -> dict[str, tuple[int, int]]:
    """Every stored episode file with its inode and mtime: rewritten files would change both."""
    return {
        p.name: (p.stat().st_ino, p.stat().st_mtime_ns)
        for p in (out / "episodes").iterdir()
        if not p.name.startswith(".")
    }


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("resume")
    checkpoint = save_checkpoint(small_model(), tmp / "pretrained")
    return tmp, checkpoint, Experiment(config(tmp, checkpoint, 1, "reference", rounds=2)).run()


@pytest.mark.timeout(600)
def test_a_run_killed_in_the_middle_of_a_round_resumes_where_it_stopped(uninterrupted):
    """SIGKILL while round 1 collects its episodes: the resumed run keeps what was stored (no
    episode runs twice, the registry is the one it left) and ends with the uninterrupted run's
    figures."""
    tmp, checkpoint, reference = uninterrupted
    out = tmp / "killed"
    script = (  # one torch thread, as in this test process (conftest): the same float32 sums
        "import sys; sys.path.insert(0, sys.argv[1]); import pathlib, torch;"
        "torch.set_num_threads(1);"
        "from test_experiment import config; from simdist_adapter.experiment import Experiment;"
        "Experiment(config(pathlib.Path(sys.argv[2]), sys.argv[3], 1, 'killed', 2)).run()"
    )
    tests = str(pathlib.Path(__file__).parent)
    proc = subprocess.Popen(
        [sys.executable, "-c", script, tests, str(tmp), str(checkpoint)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 300
        while not any((out / "episodes").glob("*.json")):  # round 1 has stored an episode
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    # whole episodes only: the JSON is written last, so an .npz without it (the kill landed
    # between the two) is an episode that was not stored, and it runs again
    kept = {
        name: stat
        for name, stat in _stored(out).items()
        if (out / "episodes" / f"{name.split('.')[0]}.json").exists()
    }
    assert kept
    assert not (out / "simdist" / "rounds.json").exists()  # killed before the round's record
    resumed = Experiment(config(tmp, checkpoint, 1, "killed", rounds=2)).run()
    assert figures(resumed) == figures(reference)
    now = _stored(out)
    assert all(now[name] == stat for name, stat in kept.items())  # nothing stored ran again
    history = json.loads((out / "simdist" / "registry" / "history.json").read_text())
    assert len(history) == 1 + sum(rd["deployed"] for rd in resumed["methods"]["simdist"]["rounds"])


@pytest.mark.slow  # 40 s; the kill in the middle of a round stays in make test
def test_a_round_killed_after_deploying_is_rolled_back_and_run_again(uninterrupted, monkeypatch):
    """The window between the registry's deploy and the round's record: the resumed run rolls
    the unrecorded version back, runs the round again, and reports the uninterrupted figures."""
    tmp, checkpoint, reference = uninterrupted
    cfg = config(tmp, checkpoint, 1, "deployed", rounds=2)
    write = Experiment._write_rounds

    def killed(root, rounds):
        raise KeyboardInterrupt("killed after the registry deployed round 1")

    monkeypatch.setattr(Experiment, "_write_rounds", staticmethod(killed))
    with pytest.raises(KeyboardInterrupt):
        Experiment(cfg).run()
    registry = pathlib.Path(cfg.out) / "simdist" / "registry"
    assert [h["version"] for h in json.loads((registry / "history.json").read_text())] == [
        "v0000",
        "v0001",
    ]
    monkeypatch.setattr(Experiment, "_write_rounds", staticmethod(write))
    resumed = Experiment(cfg).run()
    assert figures(resumed) == figures(reference)
    versions = [h["version"] for h in json.loads((registry / "history.json").read_text())]
    assert versions[0] == "v0000" and "v0001" not in versions  # rolled back, deployed anew
    assert len(versions) == 1 + sum(
        rd["deployed"] for rd in resumed["methods"]["simdist"]["rounds"]
    )
    # an ablation run into the same folder with fewer rounds: results.json keeps both methods
    one = Experiment(dataclasses.replace(cfg, methods=("unfreeze_value",), rounds=1)).run()
    assert set(one["methods"]) == {"simdist", "unfreeze_encoder", "base_policy", "unfreeze_value"}
    assert one["methods"]["unfreeze_value"]["config"]["rounds"] == 1
    assert one["methods"]["simdist"]["config"]["rounds"] == 2
    assert len(one["methods"]["unfreeze_value"]["curve"]) == 2
    assert one["methods"]["simdist"]["curve"] == resumed["methods"]["simdist"]["curve"]


def test_other_speed_points_are_parsed_and_checked():
    cfg = parse_args(
        ["--checkpoint", "ckpt", "--other-speeds", "0.1,0.5", "--other-speeds-at", "0,1,-1"]
    )
    assert cfg.other_speeds == (0.1, 0.5) and cfg.other_speeds_at == (0, 1, -1)
    with pytest.raises(ValueError, match="other_speeds_at"):
        ExperimentConfig(checkpoint="ckpt", rounds=2, other_speeds_at=(3,))


def test_seed_ranges_that_would_overlap_are_refused_with_the_ranges_named(tmp_path):
    with pytest.raises(
        ValueError, match=r"evaluation seeds 0\.\.100000, which run into the collection"
    ):
        ExperimentConfig(checkpoint="ckpt", eval_episodes=100_001)
    with pytest.raises(ValueError, match=r"--rounds x --episodes-per-round needs collection seeds"):
        ExperimentConfig(checkpoint="ckpt", rounds=10_001, episodes_per_round=10)
    with pytest.raises(ValueError, match="other-eval-episodes"):
        ExperimentConfig(checkpoint="ckpt", other_speeds=(0.5,), other_eval_episodes=100_001)
    ExperimentConfig(checkpoint="ckpt", eval_episodes=100_000, rounds=10_000, episodes_per_round=10)


def test_the_gate_set_needs_training_episodes_beside_it():
    with pytest.raises(ValueError, match="gate_episodes"):
        ExperimentConfig(checkpoint="ckpt", episodes_per_round=2, gate_episodes=2)
    with pytest.raises(ValueError, match="gate_episodes"):
        ExperimentConfig(checkpoint="ckpt", gate_episodes=0)


def test_every_round_gates_on_the_same_episodes_and_never_trains_on_them(uninterrupted):
    """Three rounds (the fixture's two, then one more into the same folder): the gate reads the
    first two collected episodes each round; D_real's training windows never hold them."""
    tmp, checkpoint, _ = uninterrupted
    cfg = config(tmp, checkpoint, 1, "gate", rounds=3)
    cfg = dataclasses.replace(cfg, methods=("simdist",), other_speeds_at=(0, -1))
    results = Experiment(cfg).run()
    rounds = json.loads((pathlib.Path(cfg.out) / "simdist" / "rounds.json").read_text())
    assert len(rounds) == 3
    # the other speeds only at zero-shot and after the last round (--other-speeds-at 0,-1)
    curve = results["methods"]["simdist"]["curve"]
    assert ["other_speeds" in c for c in curve] == [True, False, False, True]
    assert all(r["gate_seeds"] == [100_000, 100_001] for r in rounds)
    d_real = pathlib.Path(cfg.out) / "simdist" / "d_real"
    train, held = real_windows(d_real, 3, 3, 0.5, 0, cfg.gate_seeds)
    data = ShardedDataset(d_real)
    seed_of = lambda subset: {  # noqa: E731
        int(data.episode_info(int(subset.dataset.episode_index[i]))["seed"]) for i in subset.indices
    }
    assert seed_of(held) == {100_000, 100_001}
    assert not seed_of(train) & {100_000, 100_001} and len(seed_of(train)) == 7  # 3 x 3 - 2


@pytest.mark.timeout(600)
def test_a_killed_run_committed_to_git_continues_from_a_fresh_clone(uninterrupted, monkeypatch):
    """The run folder is committed (its .gitignore leaves the registries and D_real out), cloned
    elsewhere and continued with the same config: the registry is rebuilt from the recorded
    deltas, nothing stored runs again, and the figures are the uninterrupted run's."""
    tmp, checkpoint, reference = uninterrupted
    repo = tmp / "repo"
    cfg = config(repo, checkpoint, 1, "run", rounds=2)
    adapt = Experiment._adapt_round

    def killed_in_round_2(self, name, root, registry, adapt_cfg, rounds):
        if rounds:
            raise KeyboardInterrupt("killed at the start of round 2")
        return adapt(self, name, root, registry, adapt_cfg, rounds)

    monkeypatch.setattr(Experiment, "_adapt_round", killed_in_round_2)
    with pytest.raises(KeyboardInterrupt):
        Experiment(cfg).run()
    monkeypatch.setattr(Experiment, "_adapt_round", adapt)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "-C", str(repo), "add", "-A"], check=True)
    subprocess.run([*git, "-C", str(repo), "commit", "-qm", "round 1"], check=True)
    tracked = subprocess.run(
        ["git", "-C", str(repo), "ls-files"], check=True, capture_output=True, text=True
    ).stdout.split()
    assert not [f for f in tracked if "/registry/" in f or "/d_real/" in f or "/." in f[4:]]
    rounds = json.loads((repo / "run" / "simdist" / "rounds.json").read_text())
    assert len(rounds) == 1
    assert rounds[0]["report"]["deployed"]  # so the clone must rebuild v0001 from its delta
    assert f"run/simdist/versions/{rounds[0]['report']['version']}.safetensors" in tracked
    size = sum((repo / f).stat().st_size for f in tracked)
    summary = run_summary(repo / "run")  # what make demo prints of a committed run
    assert "simdist 1/2 rounds" in summary and "unfreeze_encoder" not in summary
    assert "8 + 0 samples x 1 iterations, 2 elites, replan period 1" in summary
    clone = tmp / "clone"
    subprocess.run(["git", "clone", "-q", str(repo), str(clone)], check=True)
    before = _stored(clone / "run")
    resumed = Experiment(dataclasses.replace(cfg, out=str(clone / "run"))).run()
    assert figures(resumed) == figures(reference)
    after = _stored(clone / "run")
    assert all(after[name] == stat for name, stat in before.items())  # nothing re-ran
    assert size < 5e6  # the small run's folder: episodes, rounds, deltas, config
    with pytest.raises(ValueError, match="another pretrained checkpoint"):
        other = save_checkpoint(small_model(seed=1), tmp / "other")
        Experiment(dataclasses.replace(cfg, out=str(clone / "run"), checkpoint=str(other)))


def test_a_zero_shot_evaluation_cut_short_is_summarised_from_the_stored_episodes(tmp_path):
    """A run killed during its zero-shot evaluation has no zero_shot.json yet: the summary counts
    the pretrained model's stored planner episodes on evaluation seeds, per speed, and nothing
    else (another model's, pi's, or collected episodes)."""
    config = {
        "command": "simdist-adapt-experiment ...",
        "checkpoint_digest": "pre",
        "planner": {
            "num_samples": 450, "mixture_coef": 0.05, "iterations": 8, "num_elites": 64,
            "replan_period": 2, "evaluator": "fast", "precision": "bfloat16",
        },
        "config": {"methods": ["simdist"], "rounds": 6, "eval_episodes": 20},
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    store = EpisodeStore(tmp_path / "episodes")
    jobs = [
        ({"checkpoint": "pre", "agent": "planner", "seed": 0, "course": {"speed": 0.3}}, True),
        ({"checkpoint": "pre", "agent": "planner", "seed": 1, "course": {"speed": 0.3}}, False),
        ({"checkpoint": "pre", "agent": "planner", "seed": 0, "course": {"speed": 0.1}}, False),
        ({"checkpoint": "pre", "agent": "policy", "seed": 2, "course": {"speed": 0.3}}, True),
        ({"checkpoint": "v1", "agent": "planner", "seed": 2, "course": {"speed": 0.3}}, True),
        ({"checkpoint": "pre", "agent": "planner", "seed": 100_000, "record": True,
          "course": {"speed": 0.3}}, True),
    ]  # fmt: skip
    for identity, success in jobs:
        store.save(store.key(identity), Episode(success, 1.0, 10, ""), identity)
    summary = run_summary(tmp_path)
    assert "zero-shot evaluation in progress" in summary
    assert "zero-shot so far: 0/1 at 0.1 m/s, 1/2 at 0.3 m/s" in summary
    # the zero-shot evaluation done, no round evaluated yet: its row, with every figure
    zero = _score([Episode(True, 1.9, 60, ""), Episode(False, 1.0, 40, "")], 0.02, 100)
    (tmp_path / "zero_shot.json").write_text(json.dumps(zero))
    summary = run_summary(tmp_path)
    assert "(zero-shot only)" in summary and "zero-shot so far" not in summary
    (row,) = [line for line in summary.splitlines() if line.startswith("zero_shot")]
    assert row.split()[1:3] == ["0", "1/2"] and "    1    0.8 s" in row


def test_falls_are_episodes_ended_early_without_success_and_their_length_is_the_time_to_fall():
    dt, limit = 0.02, 100
    episodes = [
        Episode(True, 1.9, 60, ""),  # crossed early: a success, not a fall
        Episode(False, 1.2, 40, ""),  # fell after 0.8 s
        Episode(False, 0.7, 20, ""),  # fell after 0.4 s
        Episode(False, 0.9, 100, ""),  # stood to the limit
        Episode(False, math.nan, 3, "planner raised"),  # an error, not a fall
    ]
    score = _score(episodes, dt, limit)
    assert score["falls"] == 2 and score["mean_time_to_fall_s"] == pytest.approx(0.6)
    assert score["mean_distance"] == pytest.approx((1.9 + 1.2 + 0.7 + 0.9) / 4)
    assert _score(episodes[:1] + episodes[3:4], dt, limit)["mean_time_to_fall_s"] is None
    table = format_table({"methods": {"simdist": {"curve": [{"real_episodes": 0, **score}],
                                                  "rounds": []}}})  # fmt: skip
    header, row = table.splitlines()
    assert "fell  to fall" in header and "    2    0.6 s" in row
