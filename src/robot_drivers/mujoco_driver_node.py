"""MuJoCo robot driver node: a simulated UR5e or Go2 task behind standard ROS topics.

Lockstep (default): the node owns sim time. It publishes tick k (`/clock`, then the sensor
topics, all stamped with tick k's time) and advances exactly one control period when the
command on `/simdist/safe_command` stamped with tick k arrives, so a CPU-bound graph with
`use_sim_time` is deterministic. Real-time mode: a wall-clock timer steps the task and applies the
newest command (HOLD when none is fresh); stamps are then wall-clock time.
`~/reset` starts an episode with the `seed` parameter; `/simdist/episode` reports reward and
success every tick for the recorder. Topics and packing: docs/observation_topics.md.
With `wait_for_ready` (set by the launch description when recording in lockstep) the first tick
waits until the recorder says every topic of the loop is matched, so the bag misses no tick.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import mujoco
import numpy as np
import rclpy
from geometry_msgs.msg import PoseStamped
from nav_msgs.msg import Odometry
from rclpy.clock import Clock, ClockType
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from rclpy.task import Future
from rosgraph_msgs.msg import Clock as ClockMsg
from sensor_msgs.msg import Image, Imu, JointState
from std_msgs.msg import Bool, String
from std_srvs.srv import Trigger
from trajectory_msgs.msg import JointTrajectory

from robot_drivers import registry, ros_msgs
from robot_drivers.described import Param
from robot_drivers.diagnostics import CommandSourceWatch, Diagnostics, Level
from robot_drivers.interface import Command, CommandKind, FaultLevel, Observation
from robot_drivers.node_params import NodeParams
from robot_drivers.node_spin import spin_until_shutdown
from robot_drivers.tasks.base import Task
from robot_drivers.tasks.options import Option
from robot_drivers.ur5e.config import SceneConfig

CLOCK_START_NS = 1_000_000_000  # sim time starts at 1 s: ROS treats time 0 as "not set"


@dataclass
class TickResult:
    obs: Observation
    reward: float
    done: bool
    success: bool
    info: dict


class SimEpisode:
    """A task driven one `Command` at a time, with the safe actions mapped onto the task.

    HOLD = the task's `hold_action` (UR5e: a zero pose delta keeping the gripper state; Go2: stand
    at the default pose). DAMP = the backend's damping mode where the task has one
    (`damping_mode`: the Go2), which ends the episode (reset to go on); HOLD elsewhere.
    """

    def __init__(self, task: Task):
        self.task = task
        self.robot = task.spec.name
        self.obs: Observation | None = None
        self.done = True
        self.step_count = 0

    def reset(self, seed: int) -> Observation:
        self.obs = self.task.reset(seed)
        self.done, self.step_count = False, 0
        return self.obs

    def apply(self, command: Command) -> TickResult:
        if self.done or self.obs is None:
            raise RuntimeError(f"{self.task.name}: the episode is over; call ~/reset")
        expected = self.task.spec.command_kind
        kind = command.kind
        if kind not in (expected, CommandKind.HOLD, CommandKind.DAMP):
            raise ValueError(
                f"{self.robot} expects {expected.value}, hold or damp commands, got {kind.value}"
            )
        self.step_count += 1
        if self.task.damping_mode and kind == CommandKind.DAMP:
            self.task.backend.act(command)
            self.obs = self.task.backend.step()
            self.done = True
            return TickResult(
                self.obs, 0.0, True, False, {"damped": True, "terminated": True, "truncated": False}
            )
        if kind == expected:
            action = np.asarray(command.values, dtype=np.float64)
        else:
            action = self.task.hold_action(self.obs)
        r = self.task.step(action)
        self.obs = r.obs
        errors = [f for f in self.task.backend.faults() if f.level >= FaultLevel.ERROR]
        self.done = bool(r.terminated or r.truncated or errors)
        info = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in r.info.items()}
        return TickResult(
            r.obs,
            float(r.reward),
            self.done,
            bool(r.success),
            {**info, "terminated": bool(r.terminated or errors), "truncated": bool(r.truncated)},
        )


def _option_param(o: Option) -> Param:
    """The read-only parameter of a scalar task option (robot_drivers.tasks.options): its "not
    set" value (0, '') as the default; its range lives in the option's validator (`_check`)."""
    span = f" ({o.span()})" if o.span() else ""
    return Param(
        o.name, o.unset_value, f"{o.doc}{span}; {o.unset_value!r}: {o.unset}", read_only=True
    )


# The task options a parameter sets (every registered option that is one value); the others
# are the UR5e scene's image size and cameras, the parameters below.
OPTION_PARAMS = tuple(_option_param(o) for o in registry.all_options() if o.scalar)

PARAMS = (
    Param(
        "robot",
        "",
        "ur5e or go2; empty = the task's robot (a mismatch is an error)",
        read_only=True,
    ),
    Param(
        "task",
        "peg",
        registry.task_list(),
        read_only=True,
    ),
    Param("variant", "sim", "sim (training) or real (the hardware stand-in)", read_only=True),
    Param(
        "cameras",
        ["wrist", "overhead", "side"],
        "UR5e cameras to render ([] for none)",
        read_only=True,
    ),
    Param(
        "image_height",
        SceneConfig().image_size[0],
        "UR5e rendered image height (pixels)",
        8,
        1024,
        read_only=True,
    ),
    Param(
        "image_width",
        SceneConfig().image_size[1],
        "UR5e rendered image width (pixels)",
        8,
        1024,
        read_only=True,
    ),
    *OPTION_PARAMS,
    Param("seed", 0, "seed of the next ~/reset (and of the first episode)", 0, 2**31 - 1),
    Param(
        "lockstep",
        True,
        "advance only when the command for the current tick arrives (sim time)",
        read_only=True,
    ),
    Param(
        "episodes",
        0,
        "episodes to run back to back (seeds seed, seed+1, ...); then the node exits 0; "
        "0 = until stopped",
        0,
        1_000_000,
    ),
    Param(
        "min_episode_steps",
        5,
        "an episode that ends within this many steps is short (a robot that falls at once; "
        "one the supervisor ends with DAMP is not counted)",
        0,
        100_000,
    ),
    Param(
        "max_short_episodes",
        10,
        "after this many short episodes in a row no new episode starts until ~/reset "
        "(a falling robot must not restart in a loop); 0 = never pause",
        0,
        100_000,
    ),
    Param(
        "realtime_factor",
        1.0,
        "real-time mode: sim seconds per wall second",
        0.05,
        20.0,
        read_only=True,
    ),
    Param(
        "command_timeout_s",
        0.5,
        "real-time mode: HOLD when no command arrived within this (wall s)",
        0.01,
        10.0,
    ),
    Param(
        "lockstep_republish_s",
        1.0,
        "lockstep: republish the waiting tick this often (late joiners)",
        0.05,
        60.0,
    ),
    Param(
        "wait_for_ready",
        "",
        "lockstep: latched std_msgs/Bool topic that must say true before the first tick; "
        "'' = start at once",
        read_only=True,
    ),
    Param(
        "ready_timeout_s",
        60.0,
        "longest wait for wait_for_ready (wall s); then start with a warning",
        0.0,
        600.0,
        read_only=True,
    ),
)


class MujocoDriverNode(Node):
    def __init__(self, **kwargs):
        super().__init__("mujoco_driver", **kwargs)
        self.params = NodeParams(self, PARAMS, _check)
        p = self.params
        self.episode = SimEpisode(
            registry.make_task(p["task"], p["variant"], **_task_options(p.values))
        )
        self.spec = self.episode.task.spec
        self.period_ns = round(1e9 / self.spec.control_rate_hz)
        self.lockstep = p["lockstep"]
        self.tick = 0
        self.episode_id = 0
        self._short_episodes = 0  # episodes in a row shorter than min_episode_steps
        self._counted_episode = -1  # the episode restart_paused last counted
        self.seed = p["seed"]
        self.last = TickResult(self.episode.reset(self.seed), 0.0, False, False, {})
        self.latest: tuple[Command, float] | None = (
            None  # real-time mode: newest command, wall time
        )
        self.dropped = 0
        self.finished: Future = Future()  # set when `episodes` episodes have run
        self.diag = Diagnostics(self, hardware_id=f"mujoco:{p['task']}:{p['variant']}")
        self._make_io()
        steady = Clock(clock_type=ClockType.STEADY_TIME)
        self._ready_deadline = None  # wall time the first tick starts at the latest, while waiting
        self._stamp = -1  # stamp of the published tick; none yet
        if self.lockstep:
            self._last_publish = time.monotonic()
            self.create_timer(0.05, self.republish_if_waiting, clock=steady)
        else:
            self.create_timer(
                self.period_ns * 1e-9 / p["realtime_factor"], self.realtime_tick, clock=steady
            )
        if self.lockstep and p["wait_for_ready"]:
            latched = QoSProfile(
                depth=1,
                reliability=ReliabilityPolicy.RELIABLE,
                durability=DurabilityPolicy.TRANSIENT_LOCAL,
            )
            self.create_subscription(Bool, p["wait_for_ready"], self.on_ready, latched)
            self._ready_deadline = time.monotonic() + p["ready_timeout_s"]
            self.diag.set(
                "start", Level.WARN, f"waiting for {p['wait_for_ready']} before the first tick"
            )
        else:
            self.publish_tick()

    def _make_io(self) -> None:
        self.pub_clock = self.create_publisher(ClockMsg, "/clock", 10)
        self.pub_joints = self.create_publisher(
            JointState, "/joint_states", ros_msgs.RECORDED_DEPTH
        )
        self.pub_proprio = self.create_publisher(
            JointState, "/simdist/robot/proprio", ros_msgs.RECORDED_DEPTH
        )
        self.pub_cams = {
            c: self.create_publisher(Image, f"/camera/{c}/image_raw", 10) for c in self.spec.cameras
        }
        self.pub_episode = self.create_publisher(
            String, "/simdist/episode", ros_msgs.RECORDED_DEPTH
        )
        # the robot's own sensors (ros_msgs.SENSOR_TOPICS): a floating base, or a TCP pose
        self.floating_base = "/odom" in ros_msgs.SENSOR_TOPICS[self.spec.name]
        if self.floating_base:
            self.pub_imu = self.create_publisher(Imu, "/imu", 10)
            self.pub_odom = self.create_publisher(Odometry, "/odom", 10)
            self.pub_height = self.create_publisher(Image, "/height_map", 10)
        else:
            self.pub_tcp = self.create_publisher(PoseStamped, "/tcp_pose", 10)
        self.create_subscription(JointTrajectory, "/simdist/safe_command", self.on_command, 10)
        self.pub_applied = self.create_publisher(
            JointTrajectory, ros_msgs.APPLIED_COMMAND_TOPIC, ros_msgs.RECORDED_DEPTH
        )
        self.command_source = CommandSourceWatch(self, self.diag, "/simdist/safe_command")
        self.create_service(Trigger, "~/reset", self.on_reset)

    # --- time ---------------------------------------------------------------------------------
    def stamp_ns(self) -> int:
        if self.lockstep:
            return CLOCK_START_NS + self.tick * self.period_ns
        return self.get_clock().now().nanoseconds

    # --- publishing -----------------------------------------------------------------------------
    def publish_tick(self) -> None:
        t = self.stamp_ns()
        self._stamp = t
        self._ready_deadline = None  # a published tick has started the run
        obs = self.last.obs
        if self.lockstep:
            self.pub_clock.publish(ClockMsg(clock=ros_msgs.stamp_msg(t)))
            self._last_publish = time.monotonic()
        self.pub_joints.publish(
            ros_msgs.joint_state_msg(self.spec.joint_names, obs.joint_pos, obs.joint_vel, t)
        )
        for cam, pub in self.pub_cams.items():
            pub.publish(ros_msgs.image_to_msg(obs.images[cam], t, f"{cam}_camera"))
        priv = obs.privileged or {}
        if self.floating_base:
            self.pub_imu.publish(ros_msgs.imu_msg(priv["base_quat"], priv["base_ang_vel"], None, t))
            self.pub_odom.publish(
                ros_msgs.odometry_msg(
                    priv["base_pos"],
                    priv["base_quat"],
                    priv["base_lin_vel"],
                    priv["base_ang_vel"],
                    t,
                )
            )
            if obs.height_map is not None:
                self.pub_height.publish(ros_msgs.height_map_to_msg(obs.height_map, t))
        else:
            quat = np.zeros(4)
            mujoco.mju_mat2Quat(quat, np.asarray(priv["tcp_mat"], np.float64).reshape(9))
            self.pub_tcp.publish(ros_msgs.pose_msg(priv["tcp_pos"], quat, t))
        self.pub_episode.publish(
            ros_msgs.episode_msg(
                task=self.episode.task.name,
                variant=self.episode.task.variant,
                robot=self.spec.name,
                seed=self.seed,
                episode=self.episode_id,
                step=self.episode.step_count,
                reward=self.last.reward,
                success=self.last.success,
                terminated=self.last.info.get("terminated", False),
                truncated=self.last.info.get("truncated", False),
                done=self.episode.done,
                stamp_ns=t,
                info=self.last.info,
            )
        )
        self.pub_proprio.publish(
            ros_msgs.proprio_to_msg(obs, self.spec, t)
        )  # last: completes the tick

    def on_ready(self, msg: Bool) -> None:
        if msg.data and self._ready_deadline is not None:
            self.diag.set(
                "start", Level.OK, f"{self.params['wait_for_ready']} is ready: first tick"
            )
            self.publish_tick()

    def republish_if_waiting(self) -> None:
        if self._ready_deadline is not None:  # not started yet
            if time.monotonic() >= self._ready_deadline:
                self.diag.set(
                    "start",
                    Level.WARN,
                    f"no ready on {self.params['wait_for_ready']} within "
                    f"ready_timeout_s={self.params['ready_timeout_s']} s; started anyway",
                )
                self.publish_tick()
            return
        if time.monotonic() - self._last_publish >= self.params["lockstep_republish_s"]:
            self.publish_tick()

    # --- stepping -------------------------------------------------------------------------------
    def on_command(self, msg: JointTrajectory) -> None:
        try:
            command = ros_msgs.command_from_msg(msg, None)
        except ros_msgs.MessageError as e:
            self.diag.set("command", Level.ERROR, f"unreadable command, holding: {e}")
            command = Command(CommandKind.HOLD)
        if not self.lockstep:
            self.latest = (command, time.monotonic())
            return
        if ros_msgs.stamp_ns(msg.header.stamp) != self._stamp:
            self.dropped += 1
            self.diag.set(
                "lockstep",
                Level.WARN,
                f"dropped a command stamped {ros_msgs.stamp_ns(msg.header.stamp)} "
                f"while waiting for tick {self.tick} ({self._stamp})",
                dropped=self.dropped,
            )
            return
        self.advance(command)

    def realtime_tick(self) -> None:
        latest = self.latest
        fresh = (
            latest is not None and time.monotonic() - latest[1] <= self.params["command_timeout_s"]
        )
        if latest is not None and fresh:
            self.advance(latest[0])
        else:  # HOLD with the stale command's stamp, so a newer command still reports as newer
            self.advance(
                Command(CommandKind.HOLD, stamp=self.latest[0].stamp if self.latest else 0)
            )

    def advance(self, command: Command) -> None:
        self.params.apply()
        if self.episode.done:  # the command answering an episode's last tick starts the next one
            limit = self.params["episodes"]
            if limit and self.episode_id + 1 >= limit:
                self.diag.set("episode", Level.OK, f"all {limit} episodes done")
                if not self.finished.done():
                    self.finished.set_result(True)
                return
            if self.restart_paused():
                return
            self.start_episode(self.seed + 1)
            return
        if not command.stamp:  # a HOLD of the driver's own answers the tick it is applied on
            command = Command(command.kind, command.values, self.stamp_ns() * 1e-9)
        try:
            try:
                self.last = self.episode.apply(command)
                self.diag.set("command", Level.OK, f"applying {command.kind.value}")
            except ValueError as e:
                self.diag.set("command", Level.ERROR, f"rejected, holding instead: {e}")
                command = Command(CommandKind.HOLD, stamp=command.stamp)
                self.last = self.episode.apply(command)
            self.report_applied(command)
        except RuntimeError as e:  # the backend refused to go on (faulted): end the episode
            self.diag.set("robot", Level.ERROR, f"simulation step failed, episode ended: {e}")
            self.episode.done = True
            self.last = TickResult(
                self.last.obs, 0.0, True, False, {"terminated": True, "truncated": False}
            )
        self.tick += 1
        self.report_faults()
        self.publish_tick()

    def report_applied(self, command: Command) -> None:
        """What the robot now does, for the supervisor's step limiter."""
        self.pub_applied.publish(
            ros_msgs.command_to_msg(
                command,
                ros_msgs.action_names(self.spec.name),
                round(command.stamp * 1e9),
                self.period_ns * 1e-9,
            )
        )

    def report_faults(self) -> None:
        faults = self.episode.task.backend.faults()
        if faults:
            worst = max(faults, key=lambda f: f.level)
            level = Level.ERROR if worst.level >= FaultLevel.ERROR else Level.WARN
            self.diag.set("robot", level, "; ".join(f"{f.code}: {f.message}" for f in faults))
        else:
            self.diag.set(
                "robot",
                Level.OK,
                "no faults",
                tick=self.tick,
                episode=self.episode_id,
                step=self.episode.step_count,
            )

    def restart_paused(self) -> bool:
        """Count the episode that just ended; True while automatic restarts are paused (after
        `max_short_episodes` episodes in a row of fewer than `min_episode_steps` steps)."""
        if self._counted_episode != self.episode_id:
            self._counted_episode = self.episode_id
            # An episode the supervisor ended with DAMP (its watchdog: the planner was silent or
            # late) is no fall: counted, a planner's hiccup of damp_grace_s would end every next
            # episode at its first tick and pause the driver for good.
            if not self.last.info.get("damped"):
                short = self.episode.step_count < self.params["min_episode_steps"]
                self._short_episodes = self._short_episodes + 1 if short else 0
        limit = self.params["max_short_episodes"]
        if not limit or self._short_episodes < limit:
            return False
        self.diag.set(
            "episode",
            Level.ERROR,
            f"{self._short_episodes} episodes in a row ended within "
            f"{self.params['min_episode_steps']} steps: no new episode starts until ~/reset",
        )
        return True

    def start_episode(self, seed: int) -> None:
        self.seed = seed
        self.episode_id += 1
        self.last = TickResult(self.episode.reset(seed), 0.0, False, False, {})
        self.tick += 1  # a new tick id: stamps never repeat, sim time never goes back
        self.diag.set("episode", Level.OK, f"episode {self.episode_id} seed {seed}")
        self.report_faults()
        self.publish_tick()

    def on_reset(self, request, response):
        self.params.apply()
        self._short_episodes = 0
        self.start_episode(int(self.params["seed"]))
        response.success = True
        response.message = (
            f"episode {self.episode_id} seed {self.seed} tick {self.tick} stamp_ns {self._stamp}"
        )
        return response


def _check(name, value, values) -> str | None:
    if name == "task" and value not in registry.TASKS:
        return f"unknown task {value!r}; expected one of {sorted(registry.TASKS)}"
    if name in ("robot", "task"):
        task = values.get("task")
        if task in registry.TASKS and values.get("robot") not in ("", registry.robot_of(task)):
            return (
                f"task {task!r} runs on robot {registry.robot_of(task)!r}, "
                f"but robot is {values.get('robot')!r}"
            )
    if name == "variant" and value not in ("sim", "real"):
        return f"variant must be 'sim' or 'real', got {value!r}"
    task = values.get("task")
    if name in OPTION_NAMES and value != OPTION_NAMES[name] and task in registry.TASKS:
        # the task options' one validator (robot_drivers.tasks.options); 0 / '' is "not set"
        try:
            registry.entry(values["task"]).options.of(
                values["task"], values.get("variant"), **{name: value}
            )
        except ValueError as e:
            return str(e)
    return None


OPTION_NAMES = {q.name: q.default for q in OPTION_PARAMS}  # option parameter -> "not set"


def _task_options(values: dict) -> dict:
    """The task's options from the parameters: each option parameter set (not 0 / ''), the UR5e
    scene's image size and cameras where the task takes them."""
    task = values["task"]
    known = registry.task_options(task)
    given = {k: values[k] for k, unset in OPTION_NAMES.items() if k in known and values[k] != unset}
    if "image_size" in known:
        given["image_size"] = (values["image_height"], values["image_width"])
    if "cameras" in known:
        given["cameras"] = tuple(c for c in values["cameras"] if c)
    return given


def main(args=None):
    with rclpy.init(args=args):
        node = MujocoDriverNode()
        spin_until_shutdown(
            node,
            lambda: rclpy.spin_until_future_complete(node, node.finished),
            on_exit=node.episode.task.close,
        )


if __name__ == "__main__":
    main()
