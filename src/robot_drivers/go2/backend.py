"""`MujocoGo2Backend`: the menagerie Go2 in MuJoCo behind the common `RobotBackend` interface.

Policy actions arrive at 50 Hz; the IsaacLab DC-motor PD (Kp 25, Kd 0.5, 23.5 Nm, torque-speed
line) is recomputed at every 200 Hz physics step, because the menagerie motors are plain torque
actuators. All arrays crossing this API are in Unitree joint order (FR, FL, RR, RL).
"""

from __future__ import annotations

from dataclasses import dataclass

import mujoco
import numpy as np

from robot_drivers.go2.config import (
    DEFAULT_POSE_UNITREE,
    JOINT_RANGE_UNITREE,
    MENAGERIE_JOINT_NAMES,
    UNITREE_JOINT_NAMES,
    ActuationConfig,
    Go2Config,
    to_menagerie,
    to_unitree,
)
from robot_drivers.go2.observation import (
    NOMINAL_MATERIAL,
    PROPRIO_TERMS,
    Go2State,
    build_expert_observation,
    build_proprio,
    height_scan_term,
    scan_to_grid,
)
from robot_drivers.go2.scene import TERRAIN_GROUP, TerrainConfig, build_go2_model
from robot_drivers.go2.sensors import (
    HeightScanner,
    foot_wrenches,
    ground_z,
    terrain_contact,
    yaw_of,
)
from robot_drivers.interface import (
    Command,
    CommandKind,
    Fault,
    FaultLevel,
    Observation,
    ProprioTerm,
    RobotBackend,
    RobotSpec,
    validate_command,
)

FOOT_GEOMS = ("FR", "FL", "RR", "RL")  # Unitree order; menagerie names each foot geom by leg
FALL_BODIES = ("base", "FR_thigh", "FL_thigh", "RR_thigh", "RL_thigh")  # official terminations
MAX_ABS_ACTION = 100.0  # |a| beyond this (a 25 rad target offset) is garbage, never executed
MAX_ABS_COMMAND = (3.0, 3.0, 4.0)  # vx, vy (m/s), wz (rad/s): beyond anything the expert knows


def pd_torque(
    q: np.ndarray,
    dq: np.ndarray,
    q_target: np.ndarray,
    kp: float | np.ndarray,
    kd: float | np.ndarray,
    act: ActuationConfig,
) -> np.ndarray:
    """IsaacLab DCMotor: PD torque clipped by the torque-speed line and the effort limit."""
    tau = kp * (q_target - q) - kd * dq
    hi = np.clip(act.torque_limit * (1.0 - dq / act.velocity_limit), 0.0, act.torque_limit)
    lo = np.clip(act.torque_limit * (-1.0 - dq / act.velocity_limit), -act.torque_limit, 0.0)
    return np.clip(tau, lo, hi)


def go2_spec(config: Go2Config) -> RobotSpec:
    """Static Go2 facts; action bounds are the joint limits expressed as raw actions."""
    limits = JOINT_RANGE_UNITREE
    scale = config.actuation.action_scale
    low = (limits[:, 0] - DEFAULT_POSE_UNITREE) / scale
    high = (limits[:, 1] - DEFAULT_POSE_UNITREE) / scale
    return RobotSpec(
        name="go2",
        action_dim=12,
        control_rate_hz=1.0 / config.control_dt,
        proprio_terms=tuple(ProprioTerm(n, d) for n, d in PROPRIO_TERMS),
        height_map_shape=(config.scan.nx, config.scan.ny),
        command_dim=3,
        action_low=tuple(float(v) for v in low),
        action_high=tuple(float(v) for v in high),
        joint_names=UNITREE_JOINT_NAMES,
        command_kind=CommandKind.JOINT_POSITION,
        default_pose=tuple(float(v) for v in DEFAULT_POSE_UNITREE),
        action_scale=scale,
        joint_low=tuple(float(v) for v in limits[:, 0]),
        joint_high=tuple(float(v) for v in limits[:, 1]),
        damping_mode=True,
        bare_scene="robot_drivers.go2.scene:bare_scene",
    )


@dataclass
class _Drive:
    """The PD set-point the physics loop tracks (menagerie order)."""

    target: np.ndarray
    kp: float
    kd: float


class MujocoGo2Backend(RobotBackend):
    """Simulated Go2. `set_command` sets the velocity command; `act` sends joint targets."""

    def __init__(self, config: Go2Config | None = None, terrain: TerrainConfig | None = None):
        self.config = config or Go2Config()
        self.terrain = terrain or TerrainConfig()
        self.spec = go2_spec(self.config)
        self.model = build_go2_model(self.config, self.terrain)
        self.data = mujoco.MjData(self.model)
        m = self.model
        self._qadr = np.array([m.jnt_qposadr[m.joint(n).id] for n in MENAGERIE_JOINT_NAMES])
        self._dadr = np.array([m.jnt_dofadr[m.joint(n).id] for n in MENAGERIE_JOINT_NAMES])
        act_joint = [m.actuator_trnid[i, 0] for i in range(m.nu)]
        self._act_of_joint = np.array(
            [act_joint.index(m.joint(n).id) for n in MENAGERIE_JOINT_NAMES]
        )
        self._foot_geoms = np.array([m.geom(n).id for n in FOOT_GEOMS])
        self._terrain_geoms = np.flatnonzero(m.geom_group == TERRAIN_GROUP)
        fall_ids = [m.body(n).id for n in FALL_BODIES]
        self._fall_geoms = np.flatnonzero(np.isin(m.geom_bodyid, fall_ids) & (m.geom_contype > 0))
        self._base = m.body("base").id
        self._scanner = HeightScanner(self.config.scan)
        self._imu = {
            n: slice(
                m.sensor_adr[m.sensor(n).id],
                m.sensor_adr[m.sensor(n).id] + m.sensor_dim[m.sensor(n).id],
            )
            for n in ("imu_quat", "imu_gyro", "imu_acc")
        }
        self._renderer: mujoco.Renderer | None = None
        self._default_mj = to_menagerie(DEFAULT_POSE_UNITREE)
        self._command = np.zeros(3)
        self._contact_geoms = np.concatenate([self._foot_geoms, self._terrain_geoms])
        self._built_friction = m.geom_friction[self._contact_geoms, 0].copy()
        self._material = NOMINAL_MATERIAL
        self._reset_state()

    # ------------------------------------------------------------------ lifecycle
    def _reset_state(self) -> None:
        act = self.config.actuation
        self._drive = _Drive(self._default_mj.copy(), act.kp, act.kd)
        self._last_action = np.zeros(12)
        self._step = 0
        self._torque = np.zeros(12)

    def reset(self, seed: int | None = None, x: float = 0.0, y: float = 0.0) -> Observation:
        """Stand at the default pose (jittered per seed), feet on the ground below (x, y)."""
        rng = np.random.default_rng(seed)
        cfg = self.config
        mujoco.mj_resetData(self.model, self.data)
        q = self._default_mj * rng.uniform(*cfg.init_joint_scale, size=12)
        yaw = rng.uniform(-cfg.init_yaw_range, cfg.init_yaw_range)
        self.data.qpos[self._qadr] = q
        self.data.qpos[:3] = (x, y, 1.0)
        self.data.qpos[3:7] = (np.cos(yaw / 2), 0.0, 0.0, np.sin(yaw / 2))
        mujoco.mj_kinematics(self.model, self.data)
        clearance = min(
            self.data.geom_xpos[g, 2]
            - self.model.geom_size[g, 0]
            - ground_z(
                self.model, self.data, self.data.geom_xpos[g, 0], self.data.geom_xpos[g, 1], 5.0
            )
            for g in self._foot_geoms
        )
        self.data.qpos[2] -= clearance - 0.002  # 2 mm drop onto the ground
        mujoco.mj_forward(self.model, self.data)
        self._reset_state()
        return self.observe()

    def set_ground_friction(self, mu: float | None) -> None:
        """Make every foot-terrain contact slide at friction `mu` (None: the built scene's values).

        The official data generation randomises the feet's material (IsaacLab multiplies it by
        the terrain's 1.0); setting feet and terrain alike gives the same effective coefficient
        whichever geom's priority wins. The expert's material_properties term reports it.
        """
        if mu is None:
            self.model.geom_friction[self._contact_geoms, 0] = self._built_friction
            self._material = NOMINAL_MATERIAL
            return
        if not np.isfinite(mu) or mu <= 0:
            raise ValueError(f"ground friction must be a finite value > 0, got {mu}")
        self.model.geom_friction[self._contact_geoms, 0] = mu
        static, dynamic, restitution = NOMINAL_MATERIAL  # keep the nominal dynamic/static ratio
        self._material = (float(mu), float(mu) * dynamic / static, restitution)

    def set_command(self, command) -> None:
        """The commanded base velocity (vx, vy, wz) in the base frame."""
        c = np.asarray(command, dtype=np.float64)
        if c.shape != (3,) or not np.all(np.isfinite(c)):
            raise ValueError(
                f"go2 velocity command must be 3 finite values (vx, vy, wz), got {c!r}"
            )
        if np.any(np.abs(c) > MAX_ABS_COMMAND):
            raise ValueError(f"go2 velocity command {c.tolist()} exceeds |.| <= {MAX_ABS_COMMAND}")
        self._command = c

    def act(self, command: Command) -> None:
        validate_command(self.spec, command)
        act = self.config.actuation
        if command.kind == CommandKind.JOINT_POSITION:
            a = np.asarray(command.values, dtype=np.float64)
            if np.any(np.abs(a) > MAX_ABS_ACTION):
                raise ValueError(
                    f"go2 action {a.tolist()} has |a| > {MAX_ABS_ACTION}; expected raw policy "
                    f"actions (target = default + {act.action_scale} * a)"
                )
            self._drive = _Drive(
                to_menagerie(DEFAULT_POSE_UNITREE + act.action_scale * a), act.kp, act.kd
            )
            self._last_action = a.copy()
        elif command.kind == CommandKind.HOLD:
            self._drive = _Drive(self._default_mj.copy(), act.kp, act.kd)
            self._last_action = np.zeros(12)
        elif command.kind == CommandKind.DAMP:
            self._drive = _Drive(self._default_mj.copy(), 0.0, act.damp_kd)
            self._last_action = np.zeros(12)
        else:
            raise ValueError(
                f"go2 accepts JOINT_POSITION, HOLD or DAMP commands, got {command.kind.name}"
            )

    def step(self) -> Observation:
        """One 50 Hz control period: `decimation` physics steps, PD recomputed each time."""
        self.simulate()
        return self.observe()

    def simulate(self) -> None:
        """`step` without building the observation (a task updates the command in between)."""
        d, act = self.data, self.config.actuation
        for _ in range(self.config.decimation):
            q, dq = d.qpos[self._qadr], d.qvel[self._dadr]
            tau = pd_torque(q, dq, self._drive.target, self._drive.kp, self._drive.kd, act)
            d.ctrl[self._act_of_joint] = tau
            mujoco.mj_step(self.model, d)
        # mj_step leaves kinematics, contacts and sensors at the pre-integration state; recompute
        # them so every observation term describes the same instant.
        mujoco.mj_forward(self.model, d)
        self._torque = to_unitree(tau)
        self._step += 1

    # ------------------------------------------------------------------ sensing
    def state(self) -> Go2State:
        """The expert-facing state (Unitree order, base frame)."""
        m, d, cfg = self.model, self.data, self.config
        pos, quat = d.qpos[:3].copy(), d.qpos[3:7].copy()
        rot = d.xmat[self._base].reshape(3, 3)  # base -> world
        feet_xyz = d.geom_xpos[self._foot_geoms]
        wrench = foot_wrenches(m, d, self._foot_geoms, feet_xyz)
        clearance = np.array(
            [z - ground_z(m, d, x, y, z + cfg.scan.ray_start) for x, y, z in feet_xyz]
        )
        return Go2State(
            base_lin_vel=rot.T @ d.qvel[:3],
            base_ang_vel=d.qvel[3:6].copy(),
            projected_gravity=rot.T @ np.array([0.0, 0.0, -1.0]),
            command=self._command.copy(),
            joint_pos=to_unitree(d.qpos[self._qadr]),
            joint_vel=to_unitree(d.qvel[self._dadr]),
            last_action=self._last_action.copy(),
            scan_heights=self._scanner.scan(m, d, pos, yaw_of(quat)),
            step=self._step,
            foot_wrench=wrench,
            foot_clearance=clearance,
            material=self._material,
            kp=np.full(12, self._drive.kp),
            kd=np.full(12, self._drive.kd),
            control_dt=cfg.control_dt,
            gait_period=cfg.gait_period,
        )

    def yaw(self) -> float:
        return yaw_of(self.data.qpos[3:7])

    def tilt(self) -> float:
        """Angle between the base z axis and the world vertical (rad)."""
        return float(np.arccos(np.clip(self.data.xmat[self._base][8], -1.0, 1.0)))

    def body_contact(self) -> bool:
        """Base or a thigh touches the terrain (the official termination contact)."""
        return terrain_contact(self.data, self._fall_geoms, self._terrain_geoms)

    def fallen(self) -> bool:
        return self.tilt() > self.config.fall_tilt or self.body_contact()

    def observe(self) -> Observation:
        s = self.state()
        d = self.data
        privileged = {
            "expert_obs": build_expert_observation(s),
            "base_pos": d.qpos[:3].copy(),
            "base_quat": d.qpos[3:7].copy(),
            "base_lin_vel": s.base_lin_vel,
            "base_lin_vel_world": d.qvel[:3].copy(),
            "base_ang_vel": s.base_ang_vel,
            "projected_gravity": s.projected_gravity,
            "yaw": np.array([yaw_of(d.qpos[3:7])]),
            "joint_torque": self._torque.copy(),
            "foot_contact": (np.linalg.norm(s.foot_wrench[:, :3], axis=1) > 1.0).astype(np.float32),
            "tilt": np.array([self.tilt()]),
            "body_contact": np.array([float(self.body_contact())]),
            # The IMU on the menagerie "imu" site, as the hardware reports it.
            **{name: d.sensordata[sl].copy() for name, sl in self._imu.items()},
        }
        return Observation(
            stamp=float(d.time),
            proprio=build_proprio(s),
            height_map=scan_to_grid(
                height_scan_term(s.scan_heights), self.config.scan.nx, self.config.scan.ny
            ).astype(np.float32),
            command=s.command.astype(np.float32),
            joint_pos=s.joint_pos.astype(np.float32),
            joint_vel=s.joint_vel.astype(np.float32),
            privileged=privileged,
        )

    def render(self, height: int = 240, width: int = 320) -> np.ndarray:
        """(H, W, 3) uint8 from a camera tracking the base: an operator view, not a robot sensor."""
        if self._renderer is None or (self._renderer.height, self._renderer.width) != (
            height,
            width,
        ):
            self.close()
            self._renderer = mujoco.Renderer(self.model, height, width)
        cam = mujoco.MjvCamera()
        cam.type = mujoco.mjtCamera.mjCAMERA_TRACKING
        cam.trackbodyid = self._base
        cam.distance, cam.elevation, cam.azimuth = 1.6, -20.0, 135.0
        self._renderer.update_scene(self.data, cam)
        return self._renderer.render().copy()

    def close(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None

    def faults(self) -> list[Fault]:
        d = self.data
        if not (np.all(np.isfinite(d.qpos)) and np.all(np.isfinite(d.qvel))):
            return [
                Fault(
                    FaultLevel.ERROR,
                    "simulation_unstable",
                    "MuJoCo state is NaN/Inf; reset the backend",
                )
            ]
        if self.fallen():
            return [
                Fault(
                    FaultLevel.ERROR,
                    "fallen",
                    f"base tilt {self.tilt():.2f} rad or body-ground contact; send DAMP and reset",
                )
            ]
        return []
