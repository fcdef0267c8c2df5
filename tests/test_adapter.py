"""Real-world adaptation library: bags -> D_real -> Eq. 3 on f -> gate -> registry / rollback."""

import dataclasses

import numpy as np
import pytest
import torch
from rclpy.serialization import serialize_message

import simdist_adapter.finetune as finetune
from robot_drivers.interface import Command, CommandKind, ProprioTerm, RobotSpec
from robot_drivers.ros_msgs import command_to_msg, height_map_to_msg, pack_proprio, proprio_names
from simdist_adapter.adapter import adapt_round, gate
from simdist_adapter.bags import EpisodeBagWriter, EpisodeMeta
from simdist_adapter.episodes import checkpoint_digest
from simdist_adapter.finetune import AdaptConfig, finetune_dynamics, latent_loss, real_windows
from simdist_adapter.real_data import build_real_dataset, segments_from_bag
from simdist_adapter.registry import ModelRegistry, RegistryError, load_delta, save_delta
from simdist_planner.data.reader import ShardedDataset
from simdist_planner.data.schema import EpisodeRecord, StepLayout, shard_name
from simdist_planner.data.writer import ShardWriter
from simdist_planner.model.checkpoint import save_checkpoint, weight_tensors
from simdist_planner.model.config import AttentionConfig, go2_config
from simdist_planner.model.losses import adaptation_loss
from simdist_planner.model.world_model import WorldModel

SPEC = RobotSpec(
    name="go2",
    action_dim=12,
    control_rate_hz=50.0,
    proprio_terms=(
        ProprioTerm("base_lin_vel", 3),
        ProprioTerm("base_ang_vel", 3),
        ProprioTerm("projected_gravity", 3),
        ProprioTerm("joint_pos", 12),
        ProprioTerm("joint_vel", 12),
        ProprioTerm("cos_sin_phase", 2),
    ),
    height_map_shape=(21, 15),
    command_dim=3,
    joint_names=tuple(f"j{i}" for i in range(12)),
)
H = T = 3


def small_model(seed=0) -> WorldModel:
    torch.manual_seed(seed)
    cfg = go2_config(
        history=H,
        horizon=T,
        latent_dim=32,
        dynamics=AttentionConfig(1, 4),
        reward=AttentionConfig(1, 4),
        value=AttentionConfig(1, 4),
        policy=AttentionConfig(1, 4),
        dropout_mlp=0.0,
        dropout_attention=0.0,
    )
    return WorldModel(cfg)


def write_episode_bag(path, seed, steps=24, hold_at=None):
    """A bag as the recorder writes it: ingestion observations + executed safe commands."""
    rng = np.random.default_rng(seed)
    A = np.eye(35, dtype=np.float32) * 0.95
    B = np.random.default_rng(123).normal(0, 0.2, (35, 12)).astype(np.float32)
    x = rng.normal(0, 1, 35).astype(np.float32)
    names = proprio_names(SPEC)
    with EpisodeBagWriter(
        path, EpisodeMeta(task="slippery_slope", seed=seed, success=True, complete=True)
    ) as bag:
        bag.add_topic("/simdist/observation/proprio", "sensor_msgs/msg/JointState")
        bag.add_topic("/simdist/observation/height_map", "sensor_msgs/msg/Image")
        bag.add_topic("/simdist/safe_command", "trajectory_msgs/msg/JointTrajectory")
        for k in range(steps):
            stamp = 1_000_000_000 + k * 20_000_000
            cmd = np.array([0.5, 0.0, 0.0], np.float32)
            msg = pack_proprio(names, x, cmd, stamp, "go2")
            hm = np.full((21, 15), 0.1 * np.tanh(x[0]), np.float32)
            bag.write_raw(
                "/simdist/observation/height_map",
                stamp,
                serialize_message(height_map_to_msg(hm, stamp)),
            )
            bag.write_raw("/simdist/observation/proprio", stamp, serialize_message(msg))
            a = rng.normal(0, 1, 12).astype(np.float32)
            command = (
                Command(CommandKind.HOLD)
                if k == hold_at
                else Command(CommandKind.JOINT_POSITION, a)
            )
            bag.write_raw(
                "/simdist/safe_command",
                stamp,
                serialize_message(command_to_msg(command, SPEC.joint_names, stamp, 0.02)),
            )
            x = (A @ x + B @ a).astype(np.float32)
    return path


@pytest.fixture(scope="module")
def bags(tmp_path_factory):
    root = tmp_path_factory.mktemp("bags")
    return [write_episode_bag(root / f"ep{i}", seed=i) for i in range(6)]


def test_segments_split_at_safe_actions(tmp_path):
    bag = write_episode_bag(tmp_path / "hold", seed=1, steps=12, hold_at=5)
    segments = segments_from_bag(bag, SPEC)
    # ticks 0-4 driven (5 transitions, the HOLD tick's observation closes them);
    # ticks 6-11 -> 5 transitions
    assert [len(s.actions) for s in segments] == [5, 5]
    assert all(len(s.observations) == len(s.actions) + 1 for s in segments)


def test_corrupt_bag_is_skipped_and_nothing_else_lost(bags, tmp_path, caplog):
    broken = write_episode_bag(tmp_path / "broken", seed=99)
    mcap = next(broken.glob("*.mcap"))
    mcap.write_bytes(mcap.read_bytes()[: mcap.stat().st_size // 3])
    report = build_real_dataset([*bags, broken], tmp_path / "d_real", SPEC)
    assert str(broken) in report.bags_skipped
    assert "truncated or corrupt" in report.bags_skipped[str(broken)]
    assert report.bags_used == [str(b) for b in bags]
    assert report.episodes == 6 and report.transitions == 6 * 23
    assert any("skipping bag" in r.message for r in caplog.records)


def test_simulation_demonstrations_join_d_real_without_their_task_state(bags, tmp_path):
    """Demos are simulation-format shards; one that stores the privileged task state (which no
    robot can record) is copied in without it, and one of another robot's layout is refused."""

    layout = dataclasses.replace(StepLayout.from_spec(SPEC), state_terms=(("slip", 2),))
    rng = np.random.default_rng(0)
    rows = 9
    steps = {
        "proprio": rng.normal(size=(rows, 35)).astype(np.float32),
        "height_map": rng.normal(size=(rows, 21, 15)).astype(np.float32),
        "command": np.full((rows, 3), 0.5, np.float32),
        "state": np.ones((rows, 2), np.float32),
        "action": rng.normal(size=(rows, 12)).astype(np.float32),
        "reward": np.zeros(rows, np.float32),
        "value": np.zeros(rows, np.float32),
        "expert": np.ones(rows, np.uint8),
        "noised": np.zeros(rows, np.uint8),
    }
    with ShardWriter(
        tmp_path / "demos" / shard_name(0), layout, {"task": "go2_slope", "config": "{}"}
    ) as w:
        w.append(
            EpisodeRecord(
                id=0,
                steps=steps,
                policy=0,
                seed=3,
                noise_scale=np.zeros(12),
                never_noised=True,
                success=True,
                terminated=True,
                truncated=False,
            )
        )
    report = build_real_dataset(bags, tmp_path / "d_real", SPEC, demos=[tmp_path / "demos"])
    assert (report.episodes, report.demo_episodes, report.transitions) == (6, 1, 6 * 23 + rows - 1)
    d_real = ShardedDataset(tmp_path / "d_real")
    demo = next(i for i in range(d_real.num_episodes) if d_real.episode_info(i)["id"] == 6)
    assert d_real.layout == StepLayout.from_spec(SPEC) and "state" not in d_real.episode(demo)
    np.testing.assert_array_equal(d_real.episode(demo)["proprio"], steps["proprio"])
    other = dataclasses.replace(layout, command_dim=0)
    steps.pop("command")
    with ShardWriter(tmp_path / "other" / shard_name(0), other, {"task": "x", "config": "{}"}) as w:
        w.append(
            EpisodeRecord(
                id=0,
                steps=steps,
                policy=0,
                seed=3,
                noise_scale=np.zeros(12),
                never_noised=True,
                success=True,
                terminated=True,
                truncated=False,
            )
        )
    with pytest.raises(ValueError, match="layout"):
        build_real_dataset(bags, tmp_path / "d_real2", SPEC, demos=[tmp_path / "other"])


def test_finetune_changes_only_f_and_lowers_heldout_loss(bags, tmp_path):
    build_real_dataset(bags, tmp_path / "d_real", SPEC)
    model = small_model()
    before = {k: v.clone() for k, v in weight_tensors(model).items()}
    train, held = real_windows(tmp_path / "d_real", H, T, holdout=0.2, seed=0)
    cfg = AdaptConfig(batch_size=16, lr=3e-3, warmup_steps=5, epochs=50, max_steps=100)
    result = finetune_dynamics(model, train, held, cfg)
    after = weight_tensors(result.model)
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed, "fine-tuning changed nothing"
    assert all(model.part_of(k) == "dynamics" for k in changed), sorted(changed)
    for k, v in weight_tensors(model).items():  # the input model is untouched
        assert torch.equal(v, before[k])
    assert result.heldout_after < result.heldout_before / 3, (
        result.heldout_before,
        result.heldout_after,
    )
    assert latent_loss(result.model, held) == pytest.approx(result.heldout_after, rel=1e-5)


def test_gate_refuses_worse_or_nonfinite():
    assert gate(0.1, 0.2)[0]
    ok, reason = gate(0.3, 0.2)
    assert not ok and "does not beat" in reason
    assert not gate(float("nan"), 0.2)[0]
    assert not gate(0.2, 0.2)[0]


def test_gate_refuses_a_candidate_that_forgot_the_simulation():
    # figures of a Slippery Slope round's size (measurements: docs/notebook/adaptation.md):
    # real loss down, sim loss up 3.3x
    ok, reason = gate(0.059, 0.273, sim_candidate=0.372, sim_deployed=0.112, max_sim_increase=0.5)
    assert not ok and "sim latent loss 0.11200 -> 0.37200" in reason and "forgot" in reason
    ok, reason = gate(0.059, 0.273, sim_candidate=0.15, sim_deployed=0.112, max_sim_increase=0.5)
    assert ok and "sim latent loss 0.11200 -> 0.15000" in reason
    assert not gate(0.059, 0.273, sim_candidate=float("nan"), sim_deployed=0.112)[0]
    assert not gate(0.3, 0.273, sim_candidate=0.1, sim_deployed=0.112)[
        0
    ]  # the real loss still decides first
    assert gate(0.059, 0.273)[0]  # without sim data: the paper's gate


def test_sim_replay_mixes_sim_windows_into_every_batch_and_guard_reports(
    bags, tmp_path, monkeypatch
):
    build_real_dataset(bags, tmp_path / "d_real", SPEC)
    sim_bags = [write_episode_bag(tmp_path / f"sim{i}", seed=50 + i) for i in range(3)]
    build_real_dataset(sim_bags, tmp_path / "sim", SPEC)
    sim = ShardedDataset(tmp_path / "sim")
    sim_rows = {
        tuple(r) for i in range(sim.num_episodes) for r in sim.episode(i)["proprio"].tolist()
    }
    seen = []

    def spy(model, batch):  # (sim windows, batch size) of every loss evaluation
        first_rows = batch["proprio"][:, 0].tolist()
        seen.append((sum(tuple(r) in sim_rows for r in first_rows), len(first_rows)))
        return adaptation_loss(model, batch)

    monkeypatch.setattr(finetune, "adaptation_loss", spy)
    model = small_model()
    before = {k: v.clone() for k, v in weight_tensors(model).items()}
    train, held = real_windows(tmp_path / "d_real", H, T, holdout=0.2, seed=0)
    cfg = AdaptConfig(
        batch_size=16,
        lr=3e-3,
        warmup_steps=5,
        max_steps=12,
        sim_data=str(tmp_path / "sim"),
        sim_replay=0.5,
    )
    result = finetune_dynamics(model, train, held, cfg)
    mixed = [n_sim for n_sim, n in seen if 0 < n_sim < n]
    assert mixed == [8] * 12  # half of every training batch replayed from the simulation data
    assert any(n_sim == n for n_sim, n in seen) and any(
        n_sim == 0 for n_sim, _ in seen
    )  # sim / real checks
    assert (
        result.sim_before is not None
        and result.sim_after is not None
        and result.sim_after != result.sim_before
    )
    changed = {k for k, v in weight_tensors(result.model).items() if not torch.equal(before[k], v)}
    assert changed and all(model.part_of(k) == "dynamics" for k in changed)
    with pytest.raises(ValueError, match="sim_replay needs sim_data"):
        AdaptConfig(sim_replay=0.5)


def test_round_deploys_gates_and_rolls_back_exactly(bags, tmp_path):
    pretrained = save_checkpoint(small_model(), tmp_path / "pretrained")
    registry = ModelRegistry(tmp_path / "registry")
    registry.init_from(pretrained)
    v0 = {k: v.clone() for k, v in weight_tensors(registry.load_deployed()).items()}
    with pytest.raises(RegistryError, match="nothing to roll back"):
        registry.rollback()

    good = AdaptConfig(batch_size=16, lr=3e-3, warmup_steps=5, epochs=50, max_steps=30, holdout=0.2)
    report = adapt_round(registry, bags, SPEC, tmp_path / "round1", good)
    assert report.deployed and report.version == "v0001"
    assert report.heldout_candidate < report.heldout_deployed
    assert registry.history()[-1]["metrics"]["heldout_latent_loss"] == pytest.approx(
        report.heldout_candidate
    )

    # A destructive candidate (huge lr) must not replace the deployed model.
    bad = AdaptConfig(batch_size=16, lr=50.0, warmup_steps=0, epochs=1, max_steps=3, holdout=0.2)
    refused = adapt_round(registry, bags, SPEC, tmp_path / "round2", bad)
    assert not refused.deployed and refused.version == "v0001"
    assert refused.heldout_candidate >= refused.heldout_deployed

    assert registry.rollback() == "v0000"
    restored = weight_tensors(registry.load_deployed())
    assert all(torch.equal(restored[k], v0[k]) for k in v0)
    assert (tmp_path / "registry" / "versions" / "v0001").is_dir()  # every version is kept


def test_a_version_kept_as_a_delta_is_rebuilt_bit_for_bit_and_only_on_its_base(tmp_path):
    """registry.save_delta keeps only the tensors that changed (as XOR of their bits); load_delta
    rebuilds the exact weights on the same pretrained model and refuses another."""
    base_model = small_model()
    base = save_checkpoint(base_model, tmp_path / "base")
    adapted = small_model()
    with torch.no_grad():
        for p in adapted.f.parameters():
            p.add_(torch.randn_like(p) * 1e-3)
    adapted_path = save_checkpoint(adapted, tmp_path / "adapted")
    changed = save_delta(adapted_path, base, tmp_path / "v0001.safetensors")
    assert changed == len(list(adapted.f.parameters()))  # f only: E, C, R, V and pi unchanged
    rebuilt = save_checkpoint(load_delta(base, tmp_path / "v0001.safetensors"), tmp_path / "re")
    assert checkpoint_digest(rebuilt) == checkpoint_digest(adapted_path)
    other = save_checkpoint(small_model(seed=1), tmp_path / "other")
    with pytest.raises(RegistryError, match="other pretrained weights"):
        load_delta(other, tmp_path / "v0001.safetensors")


def test_a_registry_moved_elsewhere_still_deploys_and_rolls_back(tmp_path):
    registry = ModelRegistry(tmp_path / "a")
    registry.init_from(save_checkpoint(small_model(), tmp_path / "pretrained"))
    registry.deploy(small_model(seed=1), {})
    (tmp_path / "a").rename(tmp_path / "b")
    moved = ModelRegistry(tmp_path / "b")
    assert moved.deployed_path().resolve() == (tmp_path / "b" / "versions" / "v0001").resolve()
    assert moved.rollback() == "v0000"
    assert moved.deployed_path().resolve() == (tmp_path / "b" / "versions" / "v0000").resolve()
    with pytest.raises(RegistryError, match="deployed already"):
        moved.deploy(small_model(), {}, version="v0000")
