"""Algorithm 2 generation on a small real task: mixture, bursts, determinism, resume, CLI."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest
import torch

import toy_task
from conftest import ROOT
from robot_drivers import registry
from robot_drivers.interface import ProprioTerm, RobotSpec
from simdist_planner.cli import generate
from simdist_planner.data.reader import ShardedDataset
from simdist_planner.data.schema import shard_name
from simdist_planner.data.windows import WindowDataset
from simdist_planner.evaluation import datagen
from simdist_planner.evaluation.agents import policy_chunk
from simdist_planner.model.checkpoint import load_checkpoint
from simdist_planner.training.config import PretrainConfig
from simdist_planner.training.loop import pretrain

TOY_ROBOT = toy_task.robot_data_config(None)


@pytest.fixture(autouse=True)
def toy(monkeypatch):
    monkeypatch.setitem(registry.TASKS, "toy", toy_task.ENTRY)
    monkeypatch.setitem(datagen.ROBOT_DATA_CONFIGS, "toy", toy_task.robot_data_config)


def config(episodes=12, seed=0, **kw) -> datagen.GenerateConfig:
    return datagen.GenerateConfig(task="toy", robot=TOY_ROBOT, episodes=episodes, seed=seed, **kw)


def contents(out) -> dict:
    """Every dataset and attribute of every shard in `out`, for exact comparison."""
    result = {}
    for path in sorted(out.glob("shard-*.h5")):
        with h5py.File(path, "r") as f:
            result[(path.name, "attrs")] = {k: str(v) for k, v in f.attrs.items()}

            def visit(name, obj, path=path):
                if isinstance(obj, h5py.Dataset):
                    result[(path.name, name)] = obj[:]

            f.visititems(visit)
    return result


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], dict):
            assert a[k] == b[k], k
        else:
            np.testing.assert_array_equal(a[k], b[k], err_msg=str(k))


def runs(flags: np.ndarray) -> list[tuple[int, int]]:
    """(value, length) of consecutive runs."""
    out, start = [], 0
    for k in range(1, len(flags) + 1):
        if k == len(flags) or flags[k] != flags[start]:
            out.append((int(flags[start]), k - start))
            start = k
    return out


def test_expert_fraction_matches_the_configured_mixture(tmp_path):
    steps, episodes = 40, 150
    cfg = config(
        episodes, seed=3, task_overrides={"terminate_on_success": False, "max_steps": steps}
    )
    datagen.generate(cfg, tmp_path, progress=False)
    ds = ShardedDataset(tmp_path)
    per_episode = np.array([ds.episode(i)["expert"][:-1].mean() for i in range(ds.num_episodes)])
    assert all(n == steps + 1 for n in ds.lengths)
    expected = datagen.expected_expert_fraction(cfg, n_ladder=3, steps=steps)
    tolerance = 4 * per_episode.std() / np.sqrt(episodes)
    assert abs(per_episode.mean() - expected) < tolerance, (per_episode.mean(), expected, tolerance)
    # policy choice is the 0.5 mixture too
    experts = sum(ds.episode_info(i)["policy"] == 0 for i in range(ds.num_episodes))
    assert abs(experts / episodes - 0.5) < 4 * np.sqrt(0.25 / episodes)


def test_expected_fraction_reproduces_the_papers_ur5e_mixture():
    # METHOD_NOTES: UR5e bursts U[1,5], clean U[5,10] -> "about 36% clean expert actions"
    frac = datagen.expected_expert_fraction(config(), n_ladder=5, steps=20_000)
    assert frac == pytest.approx(0.36, abs=0.01)
    assert datagen.expected_expert_fraction(config(expert_only=True), 5, 50) == 1.0


def test_flags_bursts_and_noise_scales_follow_algorithm_2(tmp_path):
    cfg = config(30, seed=5, task_overrides={"terminate_on_success": False, "max_steps": 40})
    datagen.generate(cfg, tmp_path, progress=False)
    ds = ShardedDataset(tmp_path)
    nz = TOY_ROBOT.noise
    saw_burst = False
    for i in range(ds.num_episodes):
        info, ep = ds.episode_info(i), ds.episode(i)
        expert, noised = ep["expert"][:-1], ep["noised"][:-1]
        assert ep["expert"][-1] == 0 and np.all(ep["action"][-1] == 0) and ep["reward"][-1] == 0
        # expert flag = the expert acted and no noise was added
        np.testing.assert_array_equal(expert, (info["policy"] == 0) & (noised == 0))
        assert np.all(np.array(nz.sigma_min) <= info["noise_scale"])
        assert np.all(info["noise_scale"] <= np.array(nz.sigma_max) + 1e-6)
        if info["never_noised"]:
            assert not noised.any()
        # interior runs have lengths inside the configured ranges (the ends may be cut short)
        for value, length in runs(noised)[1:-1]:
            lo, hi = nz.burst_steps if value else nz.clean_steps
            assert lo <= length <= hi
            saw_burst |= bool(value)
        # a noised action is off the clean policy's output: replay the clean policy and compare
        assert np.all(np.abs(ep["action"]) <= 1.0)  # clipped to the action bounds
    assert saw_burst


def test_noised_actions_differ_from_the_policy_and_clean_ones_do_not(tmp_path):
    cfg = config(8, seed=9, task_overrides={"terminate_on_success": False, "max_steps": 30})
    datagen.generate(cfg, tmp_path, progress=False)
    ds = ShardedDataset(tmp_path)
    ladder = toy_task.expert_ladder(None)
    task = registry.make_task("toy", **cfg.task_overrides)
    for i in range(ds.num_episodes):
        info, ep = ds.episode_info(i), ds.episode(i)
        obs = task.reset(info["seed"])  # the recorded episode replays from its seed
        np.testing.assert_array_equal(obs.proprio, ep["proprio"][0])
        for k in range(len(ep["action"]) - 1):
            clean = ladder[info["policy"]].act(obs)
            same = np.allclose(ep["action"][k], clean, atol=1e-6)
            assert same != bool(ep["noised"][k]) or np.any(np.abs(ep["action"][k]) == 1.0)
            obs = task.step(ep["action"][k]).obs
            np.testing.assert_allclose(obs.proprio, ep["proprio"][k + 1], atol=1e-6)


def test_same_seed_same_files_other_seed_differs(tmp_path):
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        datagen.generate(config(6, seed=seed), tmp_path / name, progress=False)
    assert_same(contents(tmp_path / "a"), contents(tmp_path / "b"))
    shard = shard_name(0)
    assert (tmp_path / "a" / shard).read_bytes() == (tmp_path / "b" / shard).read_bytes()
    a, c = contents(tmp_path / "a"), contents(tmp_path / "c")
    assert not np.array_equal(
        a[(shard_name(0), "steps/proprio")][:5], c[(shard_name(0), "steps/proprio")][:5]
    )


@pytest.mark.slow  # two worker processes generate episodes
def test_workers_write_one_shard_each_with_worker_independent_episodes(tmp_path):
    datagen.generate(config(7, seed=4), tmp_path / "one", workers=1, progress=False)
    paths = datagen.generate(config(7, seed=4), tmp_path / "two", workers=2, progress=False)
    assert [p.name for p in paths] == [shard_name(0), shard_name(1)]
    one, two = ShardedDataset(tmp_path / "one"), ShardedDataset(paths)
    by_id = lambda ds: {ds.episode_info(i)["id"]: ds.episode(i) for i in range(ds.num_episodes)}  # noqa: E731
    e1, e2 = by_id(one), by_id(two)
    assert e1.keys() == e2.keys() == set(range(7))
    for k in e1:
        for name in e1[k]:
            np.testing.assert_array_equal(e1[k][name], e2[k][name], err_msg=f"{k} {name}")
    with h5py.File(paths[1], "r") as f:
        assert f["episodes/id"][:].tolist() == [1, 3, 5]
        assert f.attrs["num_shards"] == 2


def test_torchrun_ranks_write_the_shards_workers_would(tmp_path, monkeypatch):
    datagen.generate(config(5, seed=4), tmp_path / "ranks", rank=1, world_size=2, progress=False)
    assert [p.name for p in (tmp_path / "ranks").iterdir()] == [shard_name(1)]
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    generate.main(
        [
            "--task",
            "toy",
            "--episodes",
            "5",
            "--seed",
            "4",
            "--out",
            str(tmp_path / "ranks"),
            "--no-progress",
        ]
    )
    by_rank = contents(tmp_path / "ranks")
    for s in (0, 1):
        ids = by_rank[(shard_name(s), "episodes/id")].tolist()
        assert ids == list(range(s, 5, 2))
        assert by_rank[(shard_name(s), "attrs")]["num_shards"] == "2"
    with pytest.raises(ValueError, match="one worker"):
        datagen.generate(config(5), tmp_path / "x", workers=2, rank=0, world_size=2, progress=False)
    with pytest.raises(ValueError, match="needs this process's rank"):
        datagen.generate(config(5), tmp_path / "y", world_size=2, progress=False)
    assert not (tmp_path / "y").exists() or not any((tmp_path / "y").iterdir())


def test_resume_after_interruption_equals_uninterrupted(tmp_path):
    datagen.generate(config(9, seed=7), tmp_path / "full", progress=False)
    part = tmp_path / "part"
    datagen.generate(config(4, seed=7), part, progress=False)  # "interrupted" after 4 episodes
    with h5py.File(part / shard_name(0), "r+") as f:  # ... in the middle of the 5th
        for name in ("proprio", "action", "images/top"):
            ds = f["steps/" + name]
            ds.resize(ds.shape[0] + 6, axis=0)
            ds[-6:] = 1
    with pytest.raises(FileExistsError, match="resume"):
        datagen.generate(config(9, seed=7), part, progress=False)
    with pytest.raises(Exception, match="config"):
        datagen.generate(config(9, seed=8), part, resume=True, progress=False)
    datagen.generate(config(9, seed=7), part, resume=True, progress=False)
    full, resumed = contents(tmp_path / "full"), contents(part)
    assert_same(full, resumed)


def test_resume_regenerates_episodes_in_a_damaged_chunk(tmp_path):
    datagen.generate(config(9, seed=7), tmp_path / "full", progress=False)
    part = tmp_path / "part"
    datagen.generate(config(6, seed=7), part, progress=False)
    # a kill while rewriting the last compressed chunk leaves garbage in it
    with h5py.File(part / shard_name(0), "r") as f:
        ds = f["steps/images/top"]
        last = (ds.shape[0] - 1) // ds.chunks[0] * ds.chunks[0]
        info = ds.id.get_chunk_info_by_coord((last, 0, 0, 0))
        first_row_of_damage = last
    with open(part / shard_name(0), "r+b") as fh:
        fh.seek(info.byte_offset)
        fh.write(b"\xff" * info.size)
    datagen.generate(config(9, seed=7), part, resume=True, progress=False)
    assert_same(contents(tmp_path / "full"), contents(part))
    assert first_row_of_damage > 0


def test_resume_sets_an_unreadable_shard_aside_and_starts_it_again(tmp_path):
    datagen.generate(config(5, seed=2), tmp_path / "full", progress=False)
    part = tmp_path / "part"
    part.mkdir()
    (part / shard_name(0)).write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 100)  # killed at creation
    datagen.generate(config(5, seed=2), part, resume=True, progress=False)
    assert (part / (shard_name(0) + ".corrupt0")).exists()
    assert_same(contents(tmp_path / "full"), contents(part))


# simdist-generate in a child process, with the toy task registered
TOY_CLI = (
    "import sys; sys.path.insert(0, %r)\n"
    "import toy_task, simdist_planner.cli.generate as d\n"
    "toy_task.register()\n"
    "sys.exit(d.main(sys.argv[1:]))\n"
) % str(ROOT / "tests")


@pytest.mark.slow
def test_resume_after_a_real_kill_equals_uninterrupted(tmp_path):
    base = [
        sys.executable,
        "-c",
        TOY_CLI,
        "--task",
        "toy",
        "--episodes",
        "300",
        "--seed",
        "3",
        "--max-steps",
        "60",
        "--no-progress",
    ]
    env = dict(os.environ)
    subprocess.run(base + ["--out", str(tmp_path / "full")], check=True, env=env)
    proc = subprocess.Popen(base + ["--out", str(tmp_path / "part")], env=env)
    shard = tmp_path / "part" / shard_name(0)
    deadline = time.time() + 120
    while time.time() < deadline and (not shard.exists() or shard.stat().st_size < 200_000):
        time.sleep(0.05)
    # the kill hits a running generator with part of its shard written
    assert proc.poll() is None, "the generator ended before it could be killed"
    assert shard.stat().st_size >= 200_000, "the generator wrote too little before the kill"
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    assert shard.stat().st_size < (tmp_path / "full" / shard_name(0)).stat().st_size
    subprocess.run(base + ["--out", str(tmp_path / "part"), "--resume"], check=True, env=env)
    assert_same(contents(tmp_path / "full"), contents(tmp_path / "part"))


def _process(pid: int) -> tuple[int, str, int] | None:
    """(parent pid, state letter, start time in clock ticks) of a live process, None once gone."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
    return int(fields[1]), fields[0], int(fields[19])


def _spawned_workers(parent: int) -> dict[int, int]:
    """{pid: start time} of the multiprocessing "spawn" children of `parent`."""
    workers = {}
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        info = _process(int(entry.name))
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if info is not None and info[0] == parent and b"spawn_main" in cmdline:
            workers[int(entry.name)] = info[2]
    return workers


def _running(pid: int, start: int) -> bool:
    """The process that had this pid and start time still runs (a zombie has ended)."""
    info = _process(pid)
    return info is not None and info[2] == start and info[1] not in "ZX"


@pytest.mark.slow  # kills a generator with live workers and waits for them
def test_workers_stop_when_the_generator_is_killed(tmp_path):
    out = tmp_path / "d"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            TOY_CLI,
            "--task",
            "toy",
            "--episodes",
            "1000000",
            "--workers",
            "2",
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    shards = [out / shard_name(k) for k in range(2)]
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not all(
            p.exists() and p.stat().st_size > 50_000 for p in shards
        ):
            time.sleep(0.05)
        # the kill hits the generator mid-generation: it and both its workers run, shards grow
        workers = _spawned_workers(proc.pid)
        assert proc.poll() is None, "the generator ended before it could be killed"
        assert len(workers) == 2 and all(_running(*w) for w in workers.items()), workers
        assert all(p.stat().st_size > 50_000 for p in shards), "the workers wrote too little"
    finally:  # a failed check must not leave a million-episode generator running
        proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    deadline = time.time() + 10  # the workers notice within a second
    while time.time() < deadline and any(_running(*w) for w in workers.items()):
        time.sleep(0.1)
    assert not any(_running(*w) for w in workers.items()), "a worker outlived its generator"
    sizes = [p.stat().st_size for p in shards]
    time.sleep(2.0)
    assert [p.stat().st_size for p in shards] == sizes  # nobody writes any more


def test_expert_only_mode_is_all_clean_expert(tmp_path):
    datagen.generate(config(5, seed=1, expert_only=True), tmp_path, progress=False)
    ds = ShardedDataset(tmp_path, expert_only=True)
    assert ds.num_episodes == 5
    for i in range(5):
        assert ds.episode_info(i)["policy"] == 0
        assert np.all(ds.episode(i)["expert"][:-1] == 1)


def test_values_and_rewards_come_from_the_task(tmp_path):
    datagen.generate(config(3, seed=2), tmp_path, progress=False)
    ds = ShardedDataset(tmp_path)
    value = toy_task.expert_value(None)
    task = registry.make_task("toy")
    assert ds.layout.state_terms == (("goal_offset", 2),)
    for i in range(ds.num_episodes):
        ep, info = ds.episode(i), ds.episode_info(i)
        obs = task.reset(info["seed"])
        assert ep["value"][0] == pytest.approx(value(obs), rel=1e-6)
        np.testing.assert_allclose(ep["state"][0], task.privileged_state(obs), rtol=1e-6)
        res = task.step(ep["action"][0])
        assert ep["reward"][0] == pytest.approx(res.reward, rel=1e-6)
        assert ep["value"][1] == pytest.approx(value(res.obs), rel=1e-6)
        np.testing.assert_allclose(ep["state"][1], task.privileged_state(res.obs), rtol=1e-6)
        assert info["success"] == bool(info["terminated"])  # toy ends only on success or time


def test_garbage_policy_output_stops_generation(tmp_path, monkeypatch):
    class NaNPolicy(toy_task.PDPolicy):
        def act(self, obs):
            return np.array([np.nan, 0.0], np.float32)

    monkeypatch.setattr(toy_task, "expert_ladder", lambda task: [NaNPolicy(1, 0, "nan")])
    with pytest.raises(RuntimeError, match="finite"):
        datagen.generate(config(2), tmp_path, progress=False)


def test_config_validation():
    with pytest.raises(ValueError, match="sigma"):
        datagen.NoiseConfig((0.5,), (0.1,), (1, 2), (1, 2))
    with pytest.raises(ValueError, match="burst_steps"):
        datagen.NoiseConfig((0.1,), (0.5,), (0, 2), (1, 2))
    with pytest.raises(ValueError, match="episodes"):
        config(0)
    bad = datagen.RobotDataConfig(
        datagen.NoiseConfig((0.1,), (0.2,), (1, 2), (1, 2)), {}, default_episodes=1
    )
    with pytest.raises(ValueError, match="dimensions"):
        datagen.EpisodeGenerator(datagen.GenerateConfig(task="toy", robot=bad, episodes=1))


def test_go2_noise_ranges_come_from_the_official_system_file():
    cfg = datagen.go2_data_config()
    assert cfg.noise.sigma_min == (0.05,) * 12 and cfg.noise.sigma_max == (2.5,) * 12
    assert cfg.noise.burst_steps == (1, 50) and cfg.noise.clean_steps == (25, 500)
    assert cfg.obs_noise["joint_vel"] == 0.75 and cfg.obs_noise["height_map"] == 0.02


def test_go2_data_randomises_friction_as_the_official_environment_and_runs_override_it():
    robot = datagen.go2_data_config()
    assert robot.task_overrides == {"friction_range": (0.2, 1.2)}  # simdist/rl/go2.py
    cfg = datagen.GenerateConfig(task="go2_slope", robot=robot, episodes=1)
    assert cfg.task_kwargs() == {"friction_range": (0.2, 1.2)}
    own = datagen.GenerateConfig(
        task="go2_slope",
        robot=robot,
        episodes=1,
        task_overrides={"friction_range": (0.5, 0.5), "episode_s": 1.0},
    )
    assert own.task_kwargs() == {"friction_range": (0.5, 0.5), "episode_s": 1.0}
    assert "friction_range" in cfg.identity_json()  # resuming other data is refused


def test_ur5e_noise_scales_with_the_action_bounds():
    spec = RobotSpec(
        "ur5e",
        7,
        5.0,
        (ProprioTerm("joint_pos", 6),),
        action_low=(-0.02,) * 3 + (-0.1,) * 3 + (0.0,),
        action_high=(0.02,) * 3 + (0.1,) * 3 + (1.0,),
    )
    cfg = datagen.robot_data_config(spec)
    np.testing.assert_allclose(cfg.noise.sigma_min, [0.001] * 3 + [0.005] * 3 + [0.025])
    np.testing.assert_allclose(cfg.noise.sigma_max, [0.01] * 3 + [0.05] * 3 + [0.25])
    assert cfg.noise.burst_steps == (1, 5) and cfg.noise.clean_steps == (5, 10)
    with pytest.raises(ValueError, match="action_low"):
        datagen.robot_data_config(RobotSpec("ur5e", 7, 5.0, ()))
    with pytest.raises(ValueError, match="no data-generation defaults"):
        datagen.robot_data_config(RobotSpec("spot", 12, 50.0, ()))


def test_cli_writes_a_readable_dataset(tmp_path, capsys):
    rc = generate.main(
        ["--task", "toy", "--episodes", "3", "--out", str(tmp_path), "--seed", "5", "--no-progress"]
    )
    assert rc == 0
    ds = ShardedDataset(tmp_path)
    assert ds.num_episodes == 3
    stored = json.loads(ds.attrs["config"])
    assert stored["seed"] == 5 and stored["task"] == "toy"
    assert stored["robot"]["noise"]["burst_steps"] == [1, 5]
    assert "clean expert actions" in capsys.readouterr().err
    std = ds.obs_noise_std()
    np.testing.assert_allclose(std["proprio"], [0.01, 0.01, 0.02, 0.02])
    assert std["height_map"] == 0.02


def _real_task_dataset(tmp_path, task, max_steps):
    probe = registry.make_task(task)
    spec = probe.spec
    probe.close()
    robot = datagen.robot_data_config(spec)
    cfg = datagen.GenerateConfig(task=task, robot=robot, episodes=2, seed=0, max_steps=max_steps)
    datagen.generate(cfg, tmp_path, progress=False)
    ds = ShardedDataset(tmp_path)
    assert ds.layout.action_dim == spec.action_dim and ds.layout.cameras == spec.cameras
    assert all(n <= max_steps + 1 for n in ds.lengths)
    assert {ds.episode_info(i)["policy_name"] for i in range(2)} <= set(
        json.loads(ds.attrs["policy_names"])
    )
    for i in range(2):
        ep = ds.episode(i)
        assert np.all(np.isfinite(ep["value"])) and np.all(np.isfinite(ep["reward"]))
        assert np.all(ep["action"] >= np.array(spec.action_low, np.float32) - 1e-6)
        assert np.all(ep["action"] <= np.array(spec.action_high, np.float32) + 1e-6)
    return ds


def test_go2_flat_generates_windows_in_the_model_format(tmp_path):
    ds = _real_task_dataset(tmp_path, "go2_flat", max_steps=30)
    w = WindowDataset(ds, 5, 5)[0]
    assert w["obs"]["height_map"].shape == (11, 21, 15) and w["obs"]["command"].shape == (11, 3)
    assert w["actions"].shape == (10, 12) and "images" not in w["obs"]
    assert "state" not in w and not ds.layout.state_terms  # the Go2 tasks define no task state


@pytest.mark.slow
def test_peg_generates_camera_windows(tmp_path):
    ds = _real_task_dataset(tmp_path, "peg", max_steps=12)
    w = WindowDataset(ds, 5, 5)[0]
    assert w["obs"]["images"].shape[:3] == (11, 3, 3) and w["actions"].shape == (10, 7)
    assert w["state"].shape == (13,)  # the task state of o_t


def _learner_checkpoint(tmp_path):
    """A world model for the camera-less toy robot, pretrained for a few steps."""

    datagen.generate(
        config(episodes=6, task_overrides={"cameras": ()}), tmp_path / "d", progress=False
    )
    cfg = PretrainConfig.from_flat(
        dict(
            model="go2",
            data=(str(tmp_path / "d"),),
            steps=3,
            batch_size=8,
            warmup_steps=1,
            checkpoint_every=3,
            workers=0,
            model_overrides={"latent_dim": 16, "history": 2, "horizon": 3},
        )
    )
    return pretrain(cfg, tmp_path / "run", progress=False)


@pytest.mark.slow  # learner-driven episodes with expert stretches
def test_learner_driven_episodes_label_pi_states_with_expert_stretches(tmp_path):
    """DAgger-style data: pi (fed the executed actions) drives, the expert takes over in
    stretches of the configured lengths, and only its actions are flagged as expert targets."""

    ckpt = _learner_checkpoint(tmp_path)
    learner = datagen.LearnerConfig(str(ckpt), learner_steps=(2, 4), expert_steps=(3, 5))
    cfg = config(
        episodes=4,
        seed=3,
        task_overrides={"cameras": (), "terminate_on_success": False},
        learner=learner,
    )
    datagen.generate(cfg, tmp_path / "dag", workers=2, progress=False)
    ds = ShardedDataset(tmp_path / "dag")
    assert json.loads(ds.attrs["policy_names"])[-1] == "learner"
    model = load_checkpoint(ckpt).eval()
    h = model.config.history
    for i in range(ds.num_episodes):
        assert ds.episode_info(i)["policy_name"] == "learner"
        ep = ds.episode(i)
        flags = ep["expert"][:-1]
        assert not ep["noised"].any() and len(flags) == 30
        stretches = runs(flags)
        assert stretches[0][0] == 0  # the learner starts
        for value, n in stretches[:-1]:  # the last stretch may be cut by the episode's end
            assert (3 <= n <= 5) if value else (2 <= n <= 4)
        proprio, actions, goal_offset = ep["proprio"], ep["action"], ep["state"]
        for k in range(len(flags)):
            if flags[k]:  # the toy expert: PD toward the goal (tests/toy_task.py)
                want = np.clip(8.0 * goal_offset[k] - 2.0 * proprio[k, 2:], -1, 1)
            else:  # pi on the executed history (o_0 repeated with zero actions at the start)
                idx = np.arange(k - h, k)
                hp = np.where(idx[:, None] >= 0, proprio[np.maximum(idx, 0)], proprio[0])
                ha = np.where(idx[:, None] >= 0, actions[np.maximum(idx, 0)], 0.0)
                inputs = {
                    "proprio": torch.from_numpy(proprio[k][None]),
                    "height_map": torch.from_numpy(ep["height_map"][k][None]),
                    "command": torch.from_numpy(ep["command"][k][None]),
                }
                want = np.clip(
                    policy_chunk(
                        model,
                        inputs,
                        torch.from_numpy(hp[None].astype(np.float32)),
                        torch.from_numpy(ha[None].astype(np.float32)),
                    )[0],
                    -1,
                    1,
                )
            np.testing.assert_allclose(actions[k], want, atol=1e-5, err_msg=f"episode {i} step {k}")
    # deterministic: the same episodes again, in one worker
    datagen.generate(cfg, tmp_path / "again", workers=1, progress=False)
    again = ShardedDataset(tmp_path / "again")
    for i in range(ds.num_episodes):
        np.testing.assert_array_equal(ds.episode(i)["action"], again.episode(i)["action"])


def test_learner_config_is_checked(tmp_path):
    with pytest.raises(ValueError, match="learner_steps"):
        datagen.LearnerConfig("ckpt", learner_steps=(0, 3))
    ckpt = _learner_checkpoint(tmp_path)
    cli = generate.build_config(
        generate.parse_args(
            ["--task", "toy", "--out", "o", "--learner", str(ckpt), "--expert-steps", "4", "6"]
        )
    )
    assert cli.learner == datagen.LearnerConfig(str(ckpt.resolve()), (3, 12), (4, 6), "cpu")
    # a camera-less model cannot drive the toy with a camera
    cfg = config(episodes=1, learner=datagen.LearnerConfig(str(ckpt)))
    with pytest.raises(ValueError, match="does not fit robot toy"):
        datagen.generate(cfg, tmp_path / "x", progress=False)
