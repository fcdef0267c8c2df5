"""Go2 MuJoCo backend: scene, joint order, PD actuation, height scan, 433-dim expert observation."""

import dataclasses

import mujoco
import numpy as np
import pytest

from robot_drivers.go2.backend import MujocoGo2Backend, pd_torque
from robot_drivers.go2.config import (
    DEFAULT_POSE_UNITREE,
    MENAGERIE_JOINT_NAMES,
    UNITREE_FROM_MENAGERIE,
    UNITREE_JOINT_NAMES,
    ActuationConfig,
    Go2Config,
    to_menagerie,
    to_unitree,
)
from robot_drivers.go2.observation import (
    EXPERT_OBS_DIM,
    EXPERT_OBS_SLICES,
    build_expert_observation,
    grid_to_scan,
    scan_to_grid,
)
from robot_drivers.go2.scene import MUJOCO_DEFAULT_SOLIMP, SlopePanel, TerrainConfig
from robot_drivers.interface import Command, CommandKind

SLOPE = TerrainConfig(panels=(SlopePanel(1.0, 10.0),), panels_start_x=0.6, plateau_length=2.0)


@pytest.fixture(scope="module")
def flat():
    return MujocoGo2Backend()


@pytest.fixture(scope="module")
def slope():
    return MujocoGo2Backend(terrain=SLOPE)


def test_model_compiles_with_the_notes_fixes(flat):
    m = flat.model
    assert (m.nq, m.nv, m.nu) == (19, 18, 12)
    assert m.opt.timestep == pytest.approx(0.005)
    assert np.all(m.dof_damping[6:] == 0) and np.all(m.dof_frictionloss[6:] == 0)
    for foot in ("FL", "FR", "RL", "RR"):
        np.testing.assert_allclose(m.geom_solimp[m.geom(foot).id], MUJOCO_DEFAULT_SOLIMP)
    assert flat.spec.control_rate_hz == pytest.approx(50.0)
    assert flat.spec.proprio_dim == 35 and flat.spec.height_map_shape == (21, 15)


def test_joint_order_round_trip_and_names():
    x = np.arange(12.0)
    np.testing.assert_array_equal(to_menagerie(to_unitree(x)), x)
    np.testing.assert_array_equal(to_unitree(to_menagerie(x)), x)
    for i, name in enumerate(UNITREE_JOINT_NAMES):
        assert MENAGERIE_JOINT_NAMES[UNITREE_FROM_MENAGERIE[i]] == name
    assert UNITREE_JOINT_NAMES[:3] == ("FR_hip_joint", "FR_thigh_joint", "FR_calf_joint")


def test_backend_reports_joints_in_unitree_order(flat):
    flat.reset(0)
    m, d = flat.model, flat.data
    d.qpos[m.jnt_qposadr[m.joint("FR_calf_joint").id]] = -2.0
    d.qpos[m.jnt_qposadr[m.joint("RL_hip_joint").id]] = 0.3
    mujoco.mj_forward(m, d)
    obs = flat.observe()
    assert obs.joint_pos[2] == pytest.approx(-2.0)  # FR calf is Unitree index 2
    assert obs.joint_pos[9] == pytest.approx(0.3)  # RL hip is Unitree index 9


def test_pd_torque_limits_and_torque_speed_line():
    act = ActuationConfig()
    big = np.full(3, 10.0)
    zero = np.zeros(3)
    np.testing.assert_allclose(pd_torque(zero, zero, big, 25.0, 0.5, act), 23.5)
    np.testing.assert_allclose(pd_torque(zero, zero, -big, 25.0, 0.5, act), -23.5)
    dq = np.array([15.0, -15.0, 30.0])
    tau_up = pd_torque(zero, dq, big, 25.0, 0.0, act)
    np.testing.assert_allclose(tau_up, [11.75, 23.5, 0.0])  # 23.5 (1 - dq / 30), clipped
    tau_down = pd_torque(zero, dq, -big, 25.0, 0.0, act)
    np.testing.assert_allclose(tau_down, [-23.5, -11.75, -23.5])
    small = pd_torque(zero, zero, np.full(3, 0.1), 25.0, 0.5, act)
    np.testing.assert_allclose(small, 2.5)  # inside the limits: plain PD


def test_height_scan_flat_ground(flat):
    obs = flat.reset(0)
    z = flat.data.qpos[2]
    assert obs.height_map.shape == (21, 15)
    np.testing.assert_allclose(obs.height_map, z - 0.3, atol=1e-6)


def test_height_scan_sees_slope_ahead_and_is_yaw_aligned(slope):
    obs = slope.reset(0)
    z = slope.data.qpos[2]
    xs = np.linspace(-0.5, 1.5, 21)  # grid x relative to the base, Unitree scan layout
    expected = np.array([z - SLOPE.ground_height(slope.data.qpos[0] + x) - 0.3 for x in xs])
    np.testing.assert_allclose(obs.height_map[:, 7], np.clip(expected, -1, 1), atol=2e-3)
    assert obs.height_map[-1, 0] < obs.height_map[0, 0] - 0.1  # far rays hit the rising panel
    # Facing away from the ramp, the grid (rotated with yaw) sees only flat floor.
    slope.data.qpos[3:7] = (0.0, 0.0, 0.0, 1.0)
    mujoco.mj_forward(slope.model, slope.data)
    back = slope.observe().height_map
    np.testing.assert_allclose(back, back[0, 0], atol=1e-6)
    flat_scan = slope.state().scan_heights
    np.testing.assert_array_equal(grid_to_scan(scan_to_grid(flat_scan)), flat_scan)


def test_height_scan_sees_stacked_pads_as_steps():
    # Pad edges fall between grid points (0.1 m apart), so no ray grazes an edge.
    pads = TerrainConfig(pads_start_x=(0.35, 0.85), pad_length=1.0, pad_thickness=0.05)
    b = MujocoGo2Backend(terrain=pads)
    obs = b.reset(0)
    x0, z = b.data.qpos[0], b.data.qpos[2]
    xs = x0 + np.linspace(-0.5, 1.5, 21)
    expected = np.array([z - pads.ground_height(x) - 0.3 for x in xs])
    np.testing.assert_allclose(obs.height_map[:, 3], expected, atol=1e-4)
    steps = sorted({round(pads.ground_height(x), 3) for x in xs})
    assert steps == [0.0, 0.05, 0.1]  # floor, one pad, the overlap of two


def test_expert_observation_layout_matches_observation_md(flat):
    expected = {
        "base_lin_vel": (0, 3),
        "base_ang_vel": (3, 6),
        "projected_gravity": (6, 9),
        "velocity_commands": (9, 12),
        "joint_pos_rel": (12, 24),
        "joint_vel_rel": (24, 36),
        "actions": (36, 48),
        "height_scan": (48, 363),
        "cos_sin_phase": (363, 365),
        "feet_body_forces": (365, 389),
        "feet_height": (389, 393),
        "base_mass": (393, 394),
        "material_properties": (394, 397),
        "joint_stiffness": (397, 409),
        "joint_damping": (409, 421),
        "joint_friction": (421, 433),
    }
    assert EXPERT_OBS_DIM == 433
    assert {k: (s.start, s.stop) for k, s in EXPERT_OBS_SLICES.items()} == expected


def test_expert_observation_terms_numerically(flat):
    flat.reset(1)
    flat.set_command([0.4, -0.1, 0.2])
    action = np.linspace(-1, 1, 12)
    flat.act(Command(CommandKind.JOINT_POSITION, action))
    for _ in range(50):
        obs = flat.step()
    x, s, S = obs.privileged["expert_obs"], flat.state(), EXPERT_OBS_SLICES
    np.testing.assert_allclose(x[S["velocity_commands"]], [0.4, -0.1, 0.2], atol=1e-6)
    np.testing.assert_allclose(
        x[S["joint_pos_rel"]], obs.joint_pos - DEFAULT_POSE_UNITREE, atol=1e-5
    )
    np.testing.assert_allclose(x[S["actions"]], action, atol=1e-6)
    phi = 50 * 0.02 * 2 * np.pi / 0.5
    np.testing.assert_allclose(x[S["cos_sin_phase"]], [np.cos(phi), np.sin(phi)], atol=1e-5)
    np.testing.assert_allclose(x[S["joint_stiffness"]], 0.0, atol=1e-5)  # Kp 25 nominal
    np.testing.assert_allclose(x[S["joint_damping"]], 0.0, atol=1e-5)  # Kd 0.5 nominal
    np.testing.assert_allclose(x[S["joint_friction"]], -1.0, atol=1e-6)
    np.testing.assert_allclose(x[S["material_properties"]], [0.8, 0.6, 0.05], atol=1e-6)
    # Standing: the legs push the feet down with the robot's weight (x 0.1 scale).
    fz = x[S["feet_body_forces"]].reshape(4, 6)[:, 2] / 0.1
    weight = flat.model.body_subtreemass[flat.model.body("base").id] * 9.81
    assert fz.sum() == pytest.approx(-weight, rel=0.1)
    np.testing.assert_allclose(x[S["feet_height"]], s.foot_clearance - 0.023, atol=1e-6)
    assert np.all(np.abs(x[S["feet_height"]]) < 0.01)  # feet on the floor
    # gravity in the base frame, from the base quaternion (not from the backend's rotation matrix)
    g = gravity_in_base(flat.data.qpos[3:7])
    assert np.linalg.norm(g[:2]) > 0.02  # the trunk is not level (a few degrees): a real check
    np.testing.assert_allclose(x[S["projected_gravity"]], g, atol=1e-6)
    np.testing.assert_allclose(obs.privileged["projected_gravity"], g, atol=1e-6)


def gravity_in_base(quat_wxyz) -> np.ndarray:
    """World gravity (0, 0, -1) in the base frame: v rotated by the conjugate (w, -u) of the base's
    unit quaternion (w, u), as v + w t + (-u) x t with t = 2 (-u) x v."""
    w, *u = np.asarray(quat_wxyz, dtype=np.float64) / np.linalg.norm(quat_wxyz)
    u, v = -np.asarray(u), np.array([0.0, 0.0, -1.0])
    t = 2.0 * np.cross(u, v)
    return v + w * t + np.cross(u, t)


def quat_zyx(roll: float, pitch: float, yaw: float) -> tuple[float, ...]:
    """wxyz quaternion q_z(yaw) q_y(pitch) q_x(roll)."""
    cr, sr, cp, sp, cy, sy = (f(a / 2) for a in (roll, pitch, yaw) for f in (np.cos, np.sin))
    return (
        cr * cp * cy + sr * sp * sy,
        sr * cp * cy - cr * sp * sy,
        cr * sp * cy + sr * cp * sy,
        cr * cp * sy - sr * sp * cy,
    )


def test_projected_gravity_follows_a_known_tilt(flat):
    flat.reset(0)
    roll, pitch, yaw = 0.3, -0.2, 1.1
    sr, cr, sp, cp = np.sin(roll), np.cos(roll), np.sin(pitch), np.cos(pitch)
    for (r, p, y), expected in (
        ((roll, 0.0, 0.0), [0.0, -sr, -cr]),  # right side down
        ((0.0, pitch, 0.0), [sp, 0.0, -cp]),  # nose up (pitch < 0)
        ((0.0, 0.0, yaw), [0.0, 0.0, -1.0]),  # yaw leaves gravity alone
        ((roll, pitch, yaw), [sp, -cp * sr, -cp * cr]),  # minus the last row of R_z R_y R_x
    ):
        quat = quat_zyx(r, p, y)
        flat.data.qpos[3:7] = quat
        mujoco.mj_forward(flat.model, flat.data)
        obs = flat.observe()
        np.testing.assert_allclose(obs.privileged["projected_gravity"], expected, atol=1e-9)
        np.testing.assert_allclose(gravity_in_base(quat), expected, atol=1e-12)
        np.testing.assert_allclose(
            obs.privileged["expert_obs"][EXPERT_OBS_SLICES["projected_gravity"]],
            expected,
            atol=1e-6,
        )
        np.testing.assert_allclose(obs.proprio[6:9], expected, atol=1e-6)  # the planner's view


def test_base_velocity_is_rotated_into_the_base_frame(flat):
    flat.reset(0)
    yaw = np.pi / 2
    flat.data.qpos[3:7] = (np.cos(yaw / 2), 0, 0, np.sin(yaw / 2))
    flat.data.qvel[:6] = (1.0, 0.0, 0.0, 0.0, 0.0, 0.5)
    mujoco.mj_forward(flat.model, flat.data)
    x = flat.observe().privileged["expert_obs"]
    np.testing.assert_allclose(x[0:3], [0.0, -1.0, 0.0], atol=1e-6)  # world +x = base -y
    np.testing.assert_allclose(x[3:6], [0.0, 0.0, 0.5], atol=1e-6)
    np.testing.assert_allclose(x[6:9], [0.0, 0.0, -1.0], atol=1e-6)


def test_state_validation_rejects_bad_shapes(flat):
    flat.reset(0)
    s = flat.state()
    with pytest.raises(ValueError, match="joint_pos"):
        build_expert_observation(dataclasses.replace(s, joint_pos=np.zeros(11)))
    with pytest.raises(ValueError, match="NaN"):
        build_expert_observation(dataclasses.replace(s, base_lin_vel=np.array([np.nan, 0, 0])))


def test_bad_commands_raise_and_change_nothing(flat):
    flat.reset(0)
    target = flat._drive.target.copy()
    bad = [
        Command(CommandKind.JOINT_POSITION, np.zeros(11)),
        Command(CommandKind.JOINT_POSITION, np.full(12, np.nan)),
        Command(CommandKind.JOINT_POSITION, np.full(12, 1e4)),
        Command(CommandKind.EE_DELTA, np.zeros(12)),
    ]
    for cmd in bad:
        with pytest.raises(ValueError, match="go2"):
            flat.act(cmd)
    np.testing.assert_array_equal(flat._drive.target, target)
    for c in ([np.nan, 0, 0], [0.5, 0.0], [10.0, 0, 0]):
        with pytest.raises(ValueError, match="velocity command"):
            flat.set_command(c)


def test_hold_keeps_standing_and_damp_goes_limp(flat):
    flat.reset(0)
    flat.act(Command(CommandKind.HOLD))
    for _ in range(100):
        flat.step()
    z_hold = flat.data.qpos[2]
    assert z_hold > 0.25 and not flat.fallen() and flat.faults() == []
    # Kp 25 lets the calves sag ~0.25 rad under the weight, as on the real robot.
    np.testing.assert_allclose(flat.observe().joint_pos, DEFAULT_POSE_UNITREE, atol=0.3)
    flat.act(Command(CommandKind.DAMP))
    for _ in range(100):
        obs = flat.step()
    assert flat.data.qpos[2] < z_hold - 0.1  # no stiffness: the legs fold under the weight
    assert np.abs(obs.privileged["joint_torque"]).max() < 0.5 * 23.5
    assert obs.privileged["expert_obs"][EXPERT_OBS_SLICES["joint_stiffness"]][0] == pytest.approx(
        -10.0
    )


def test_reset_is_deterministic_per_seed():
    b = MujocoGo2Backend(Go2Config(init_yaw_range=0.2))
    a1 = b.reset(3).proprio
    a2 = b.reset(3).proprio
    a3 = b.reset(4).proprio
    np.testing.assert_array_equal(a1, a2)
    assert not np.allclose(a1, a3)


def test_imu_readings_and_render(flat):
    flat.reset(0)
    flat.act(Command(CommandKind.HOLD))
    for _ in range(50):
        obs = flat.step()
    p = obs.privileged
    np.testing.assert_allclose(
        p["imu_quat"], p["base_quat"], atol=1e-9
    )  # the IMU site is not rotated
    np.testing.assert_allclose(p["imu_acc"], [0, 0, 9.81], atol=0.5)  # standing: reads +g
    np.testing.assert_allclose(p["imu_gyro"], p["base_ang_vel"], atol=1e-9)
    img = flat.render(48, 64)
    assert img.shape == (48, 64, 3) and img.dtype == np.uint8 and img.std() > 5
    flat.close()


def test_spec_action_bounds_are_the_model_joint_limits(flat):
    m = flat.model
    ranges = np.array([m.jnt_range[m.joint(n).id] for n in UNITREE_JOINT_NAMES])
    np.testing.assert_allclose(
        DEFAULT_POSE_UNITREE + 0.25 * np.array(flat.spec.action_low), ranges[:, 0], atol=1e-5
    )
    np.testing.assert_allclose(
        DEFAULT_POSE_UNITREE + 0.25 * np.array(flat.spec.action_high), ranges[:, 1], atol=1e-5
    )
