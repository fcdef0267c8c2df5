"""What a stored episode is keyed by: every input it depends on, so that a changed input runs it
again and an unchanged one is read back (`simdist_adapter.episodes`)."""

import dataclasses

import pytest
import torch

import simdist_adapter.episodes as episodes
from simdist_adapter.episodes import EpisodeJob, EpisodePool, EpisodeStore, course
from simdist_planner.model.checkpoint import save_checkpoint
from simdist_planner.model.world_model import WorldModel
from simdist_planner.planning import config as planning_config
from test_adapter import small_model


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """The same small Go2 model, and copies that differ in one part each."""
    root = tmp_path_factory.mktemp("keys")
    model = small_model()
    out = {
        "base": save_checkpoint(model, root / "base"),
        "same": save_checkpoint(model, root / "same"),
    }
    other = small_model()
    with torch.no_grad():
        next(other.f.parameters()).view(-1)[0] += 1e-6
    out["weights"] = save_checkpoint(other, root / "weights")
    scaled = small_model()
    with torch.no_grad():  # the observation statistics (scaler.json), not the tensors
        scaled.scaler.mean(next(iter(scaled.scaler.dims))).add_(0.5)
    out["scaler"] = save_checkpoint(scaled, root / "scaler")
    config = dataclasses.replace(  # same tensors, another computation
        model.config, numerics=dataclasses.replace(model.config.numerics, gelu_approximate="tanh")
    )
    reconfigured = WorldModel(config)
    reconfigured.load_state_dict(model.state_dict())
    out["config"] = save_checkpoint(reconfigured, root / "config")
    return out


def key(
    checkpoint,
    planner=None,
    task="slippery_slope",
    overrides=None,
    device="cpu",
    workers=1,
    job=None,
) -> str:
    pool = EpisodePool(task, overrides or {}, device, planner or {}, 1)
    pool._workers = workers  # the key's thread count; no worker process is started here
    job = job or EpisodeJob(str(checkpoint), True, 3, course=course(speed=0.3))
    return EpisodeStore.key(pool.identity(job))


def test_the_same_inputs_give_the_same_key_wherever_the_checkpoint_lies(checkpoints):
    assert key(checkpoints["base"]) == key(checkpoints["same"])


@pytest.mark.parametrize("part", ["weights", "scaler", "config"])
def test_every_part_of_the_checkpoint_is_in_the_key(checkpoints, part):
    assert key(checkpoints[part]) != key(checkpoints["base"])


@pytest.mark.parametrize(
    "planner",
    [
        {"precision": "bfloat16"},
        {"evaluator": "eager"},
        {"num_samples": 64},
        {"replan_period": 2},
        {"preset": "official"},
    ],
)
def test_the_resolved_planner_settings_are_in_the_key(checkpoints, planner):
    assert key(checkpoints["base"], planner) != key(checkpoints["base"])


def test_a_flag_set_to_the_preset_value_is_the_same_episode(checkpoints):
    """The key holds the settings that ran, not the flags typed."""
    default = planning_config.go2_planner_config((-1.0,), (1.0,)).num_samples
    assert key(checkpoints["base"], {"num_samples": default}) == key(checkpoints["base"])


def test_a_preset_whose_defaults_change_keys_its_episodes_anew(checkpoints, monkeypatch):
    before = key(checkpoints["base"])
    factory = planning_config.PLANNER_PRESETS["go2"]
    monkeypatch.setitem(
        planning_config.PLANNER_PRESETS,
        "go2",
        lambda lo, hi, **o: factory(lo, hi, **{"iterations": 3, **o}),
    )
    assert key(checkpoints["base"]) != before


def test_the_pi_agent_ignores_the_planner_settings(checkpoints):
    job = EpisodeJob(str(checkpoints["base"]), False, 3)
    assert key(checkpoints["base"], {"num_samples": 64}, job=job) == key(
        checkpoints["base"], job=job
    )
    assert key(checkpoints["base"], job=job) != key(
        checkpoints["base"], job=dataclasses.replace(job, planner=True)
    )


@pytest.mark.parametrize(
    "change",
    [
        {"task": "foam"},
        {"overrides": {"episode_s": 2.0}},
        {"device": "cuda"},
        {"job": EpisodeJob("", True, 3, course=course(speed=0.5))},
        {"job": EpisodeJob("", True, 3, course=course(speed=0.3, panel_friction=0.12))},
        {"job": EpisodeJob("", True, 4, course=course(speed=0.3))},
        {"job": EpisodeJob("", True, 3, record=True, course=course(speed=0.3))},
    ],
)
def test_task_options_device_seed_and_recording_are_in_the_key(checkpoints, change):
    if "job" in change:
        change = {"job": dataclasses.replace(change["job"], checkpoint=str(checkpoints["base"]))}
    assert key(checkpoints["base"], **change) != key(checkpoints["base"])


def test_the_torch_thread_count_is_in_the_key_and_a_worker_runs_one(checkpoints):
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = key(checkpoints["base"])
        torch.set_num_threads(2)
        assert key(checkpoints["base"]) != one
        assert key(checkpoints["base"], workers=2) == one  # spawned workers run one thread each
    finally:
        torch.set_num_threads(threads)


def test_the_episode_protocol_version_is_in_the_key(checkpoints, monkeypatch):
    before = key(checkpoints["base"])
    monkeypatch.setattr(episodes, "EPISODE_PROTOCOL", episodes.EPISODE_PROTOCOL + 1)
    assert key(checkpoints["base"]) != before


@pytest.mark.timeout(300)
def test_a_changed_setting_runs_the_episode_again_and_an_unchanged_one_reads_it_back(
    checkpoints, tmp_path
):
    store = EpisodeStore(tmp_path)
    job = EpisodeJob(str(checkpoints["base"]), True, 3, course=course(speed=0.3))
    planner = {"num_samples": 8, "iterations": 1, "num_elites": 2}
    ran = []

    def run(settings):
        pool = EpisodePool("slippery_slope", {"episode_s": 0.08}, "cpu", settings, 1, store)
        try:
            return pool.run([job], lambda i, ep, stored: ran.append(stored))[0]
        finally:
            pool.close()

    first = run(planner)
    again = run(planner)
    other = run({**planner, "replan_period": 2})
    assert ran == [False, True, False]
    assert (again.steps, again.distance) == (first.steps, first.distance)
    assert other.steps == first.steps == 4
    assert len(list(tmp_path.glob("*.json"))) == 2
