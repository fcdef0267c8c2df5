"""Planner node: MPPI over the world model at the control rate, on ingestion's latest observation.

Each tick plans on the newest complete observation (`/simdist/observation/*`, assembled by
`robot_drivers.ros_msgs.ObservationAssembler`) and publishes the first action to the safety
supervisor (`/simdist/action`), the planned mean chunk (`/simdist/plan`) and the predicted rewards
and values along it (`/simdist/values`), all stamped with the observation's stamp.

- Timing: in real-time mode a timer ticks at `control_rate_hz`; with `lockstep: true` (MuJoCo on
  /clock) each new observation is one tick, so the simulator never waits on a stale plan. Compute
  latency and deadline misses (latency > one control period) go to /diagnostics. Ticks run on
  a planning thread that owns the model; the executor's callbacks only store the newest
  observation and wake it (`_planning_loop`).
- Deadline (real-time mode): if the running latency estimate (EMA + 3 x EMA deviation) says MPPI
  would not finish within `deadline_fraction` of the period, the tick runs the base policy pi
  instead (cheap). In lockstep the simulator waits for the plan, so MPPI always runs and a run is
  deterministic; a re-sent tick gets the same answer again, never a second plan.
- NaN: a non-finite plan is never acted on: the tick sends an explicit HOLD command on
  /simdist/action (no plan) and reports an ERROR.
- Hot swap: `~/load_model` (std_srvs/Trigger) loads the `checkpoint` parameter's directory in a
  background thread, validates it (same inputs/outputs, finite plan on the latest observation)
  and swaps it in between two ticks; the control loop keeps ticking meanwhile.
- Logic: every decision (loading, hot-swap checks, parameter values -> PlannerConfig, which
  observation a tick plans on, stale observations, the deadline fallback, the plan, latency,
  deadline misses, the answered share, what the diagnostics say) lives in
  `planner_core.PlannerCore` and `planner_core.PlanningTicks` (no rclpy, tested without ROS);
  this node adds the topics, timers, the planning and loader threads and the publishing.
- Parameters: every tunable is declared with a range (the MPPI settings from
  planning.config.PLANNER_PARAMS); a set is validated (by building the
  PlannerConfig it implies) and applied at the start of the next tick. The MPPI parameters and
  the control rate default to the planner preset's (`planner_preset`, else `official` for an
  imported official model, else the robot's: `robot`, else the start-up checkpoint's):
  planning.config.PLANNER_PRESETS and RobotSpec (config/*.yaml names the preset, no value).
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import numpy as np
import rclpy
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import Image, JointState
from std_msgs.msg import String
from std_srvs.srv import Trigger
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from robot_drivers import ros_msgs
from robot_drivers.described import Param
from robot_drivers.diagnostics import Diagnostics, Level
from robot_drivers.interface import Command, CommandKind
from robot_drivers.node_params import NodeParams, descriptor
from robot_drivers.node_spin import spin_quietly, spin_until_shutdown
from robot_drivers.specs import robot_spec
from simdist_planner.planning.config import (
    PLANNER_CONFIGS,
    PLANNER_PARAMS,
    PLANNER_PRESETS,
    planner_config_for,
)
from simdist_planner.ros.planner_core import (
    ANSWER_WINDOW,
    LATENCY_EMA,
    MAX_OBSERVATION_AGE_PERIODS,
    LoadedModel,
    PlannerCore,
    PlanningTicks,
    Tick,
    load_world_model,
    resolve_preset,
    resolve_robot,
)

QOS = QoSProfile(
    depth=10,
    history=HistoryPolicy.KEEP_LAST,
    reliability=ReliabilityPolicy.RELIABLE,
    durability=DurabilityPolicy.VOLATILE,
)

# Declared before the others, which take their defaults from the robot these two name.
STARTUP_PARAMS = (
    Param(
        "robot",
        "",
        "robot whose planner defaults the other parameters take (go2, ur5e); '' = the checkpoint's",
        read_only=True,
        choices=("", *sorted(PLANNER_CONFIGS)),
    ),
    Param("checkpoint", "", "world-model checkpoint directory; ~/load_model (re)loads it"),
    Param(
        "wait_for_checkpoint",
        False,
        "start without a model when `checkpoint` cannot be loaded and wait for ~/load_model; "
        "false = exit with the error",
        read_only=True,
    ),
    Param(
        "planner_preset",
        "",
        "MPPI settings the other parameters default to (go2, ur5e, official); '' = official "
        "for an imported official model, else the robot's",
        read_only=True,
        choices=("", *sorted(PLANNER_PRESETS)),
    ),
)


def tunable_params(robot: str, preset: str = "") -> tuple[Param, ...]:
    """The node's parameters after STARTUP_PARAMS, with the defaults of `preset` (default: the
    robot's) on `robot`: its PlannerConfig (planner_config_for) and the robot's control rate
    (RobotSpec.control_rate_hz)."""
    spec = robot_spec(robot)
    planner = planner_config_for(spec, preset)
    rate = spec.control_rate_hz
    return (
        Param("device", "cpu", "torch device: cpu, cuda or cuda:N (a change reloads the model)"),
        Param("control_rate_hz", rate, "planning rate of the real-time timer", 0.5, 500.0),
        Param(
            "lockstep",
            False,
            "plan once per new observation (MuJoCo lockstep on /clock) instead of on the timer",
        ),
        *(
            Param(q.name, getattr(planner, q.name), q.doc, q.low, q.high, choices=q.choices)
            for q in PLANNER_PARAMS
        ),
        Param(
            "deadline_fraction",
            0.9,
            "share of the control period MPPI may use; predicted overrun -> base policy",
            0.05,
            1.0,
        ),
        Param(
            "fallback_to_policy", True, "run the base policy pi when MPPI would miss the deadline"
        ),
        Param(
            "latency_ema",
            LATENCY_EMA,
            "smoothing factor of the running latency estimate",
            0.01,
            1.0,
        ),
        Param(
            "reprobe_ticks",
            0,
            "while falling back, run MPPI once every N ticks to re-measure "
            "(0 = never; a probe overruns its tick)",
            0,
            100000,
        ),
        Param(
            "min_answer_share",
            0.9,
            "the planning diagnostic goes WARN when fewer than this share of the last "
            f"{ANSWER_WINDOW} new observations got an answer (the rest were superseded or stale)",
            0.0,
            1.0,
        ),
        Param(
            "max_observation_age_s",
            MAX_OBSERVATION_AGE_PERIODS / rate,
            "observations older than this are not planned on (real-time mode)",
            0.001,
            60.0,
        ),
    )


def node_params(robot: str, preset: str = "") -> tuple[Param, ...]:
    """Every parameter the node declares when it plans for `robot` with `preset`."""
    return (*STARTUP_PARAMS, *tunable_params(robot, preset))


class PlannerNode(Node):
    def __init__(self, **kwargs):
        super().__init__("planner", **kwargs)
        # The planning thread owns every tick; callbacks only store inputs and wake it. It
        # starts once the node is complete.
        self._wake = threading.Condition()
        self._tick_requested = False
        self._stopping = False
        self._planning_thread = threading.Thread(
            target=self._planning_loop, name="planning", daemon=True
        )
        startup: list[Any] = [
            self.declare_parameter(q.name, q.default, descriptor(q)).value for q in STARTUP_PARAMS
        ]
        robot, checkpoint, wait_for_checkpoint, preset = startup
        for q, value in zip(STARTUP_PARAMS, (robot, checkpoint, wait_for_checkpoint, preset)):
            if q.choices and value not in q.choices:
                raise ValueError(
                    f"planner: parameter {q.name}={value!r} must be one of {q.choices}"
                )
        robot = resolve_robot(robot, checkpoint, preset)
        # the latency smoothing follows the parameter from the first tick (_apply_params)
        self.core = PlannerCore(robot, resolve_preset(preset, robot, checkpoint), LATENCY_EMA)
        self.ticks = PlanningTicks(self.core)
        self.params = NodeParams(
            self,
            tunable_params(self.core.robot, self.core.preset),
            check=lambda name, value, values: self.core.check_param(name, values),
        )
        p = self.params.values
        self.core.latency.alpha = p["latency_ema"]
        self.diag = Diagnostics(self, hardware_id="planner")
        self._tick_lock = (
            threading.Lock()
        )  # held for a whole tick; a hot swap takes it between ticks
        self._loading = threading.Lock()  # one background load at a time
        self._answer: tuple | None = None  # (action, plan) messages of the last answered tick

        load_error = None
        try:
            self._install(load_world_model(checkpoint, p["device"]))
        except Exception as exc:  # noqa: BLE001 - reported; with wait_for_checkpoint the node stays up
            load_error = f"cannot load checkpoint {checkpoint!r}: {exc}"
            if not wait_for_checkpoint:
                raise ValueError(
                    f"planner: {load_error} (set wait_for_checkpoint to start without a model "
                    "and load one later with ~/load_model)"
                ) from None
        self._pub_action = self.create_publisher(JointTrajectory, "/simdist/action", QOS)
        self._pub_plan = self.create_publisher(JointTrajectory, "/simdist/plan", QOS)
        self._pub_values = self.create_publisher(JointTrajectory, "/simdist/values", QOS)
        if self.core.loaded is not None:
            self._subscribe(self.core.loaded)
        self.create_subscription(String, "/simdist/episode", self._on_episode, QOS)
        # ~/load_model is served by a node of its own that the node spins on a thread of its own
        # (`_loader_executor`), so that a load never holds up the observation callbacks (not
        # renamed by the process's remaps, no parameters of its own).
        self.loader = Node(
            f"{self.get_name()}_loader",
            namespace=self.get_namespace(),
            context=self.context,
            use_global_arguments=False,
            start_parameter_services=False,
        )
        self.loader.create_service(
            Trigger, f"{self.get_fully_qualified_name()}/load_model", self._on_load_model
        )
        self._timer = self.create_timer(1.0 / p["control_rate_hz"], self._on_timer)
        if load_error:
            self.diag.set("model", Level.ERROR, load_error)
        else:
            path = self.core.current_path()
            self.diag.set("model", Level.OK, f"loaded {path}", path=path)
        self.diag.set("planning", Level.WARN, "waiting for the first observation")
        self._planning_thread.start()
        self._loader_executor = SingleThreadedExecutor(context=self.context)
        self._loader_executor.add_node(self.loader)
        threading.Thread(target=self._serve_loads, name="loader", daemon=True).start()

    # -- parameters ------------------------------------------------------------------------------
    def _apply_params(self) -> None:
        """Called at the start of a tick: accepted parameter changes take effect now."""
        changed = self.params.apply()
        if not changed:
            return
        p = self.params.values
        self.core.apply_params(changed, p)
        if "control_rate_hz" in changed:
            self._timer.timer_period_ns = int(1e9 / p["control_rate_hz"])
            self._timer.reset()
        if "device" in changed:
            threading.Thread(target=self._load_and_swap, daemon=True).start()
        self.get_logger().info(f"parameters applied: {changed}")

    # -- model loading and hot swap ----------------------------------------------------------------
    def _install(self, loaded: LoadedModel) -> None:
        """Make `loaded` the planning model (caller holds the tick lock or runs before spinning)."""
        self.core.install(loaded, self.params.values)

    def _subscribe(self, loaded: LoadedModel) -> None:
        # with the spec, the proprio element names are checked: a layout change is an error
        self._assembler = ros_msgs.ObservationAssembler(
            loaded.cameras, loaded.has_height_map, spec=self.core.spec
        )
        prefix = "/simdist/observation"
        for cam in loaded.cameras:
            self.create_subscription(
                Image,
                f"{prefix}/image/{cam}",
                lambda m, c=cam: self._on_obs(self._assembler.add_image, c, m),
                QOS,
            )
        if loaded.has_height_map:
            self.create_subscription(
                Image,
                f"{prefix}/height_map",
                lambda m: self._on_obs(self._assembler.add_height_map, m),
                QOS,
            )
        self.create_subscription(
            JointState,
            f"{prefix}/proprio",
            lambda m: self._on_obs(self._assembler.add_proprio, m),
            QOS,
        )

    def _on_load_model(self, request, response):
        """~/load_model: load + validate in the background; answer once swapped or refused."""
        ok, message = self._load_and_swap()
        response.success, response.message = ok, message
        return response

    def _load_and_swap(self) -> tuple[bool, str]:
        if not self._loading.acquire(blocking=False):
            return False, "a model load is already in progress"
        try:
            # the accepted values, even if no tick has applied them yet
            path, device = (self.get_parameter(n).value for n in ("checkpoint", "device"))
            try:
                candidate = load_world_model(path, device)
                self._validate_candidate(candidate)
            except Exception as exc:  # noqa: BLE001 - a bad checkpoint is refused, the old model stays
                message = (
                    f"refused checkpoint {path!r}: {exc}; "
                    f"still planning with {self.core.current_path()}"
                )
                self.diag.set("model", Level.WARN if self.core.loaded else Level.ERROR, message)
                return False, message
            first = self.core.loaded is None
            with self._tick_lock:  # between two ticks: no tick is dropped, none sees half a swap
                self._install(candidate)
                if first:
                    self._subscribe(candidate)
            stats = self.ticks.book.stats
            stats["swaps"] += 1
            message = f"now planning with {path} on {device}"
            self.diag.set("model", Level.OK, message, path=path, swaps=stats["swaps"])
            self.get_logger().info(message)
            return True, message
        finally:
            self._loading.release()

    def _validate_candidate(self, candidate: LoadedModel) -> None:
        """Same interface as the running model, a valid planner config, a finite plan."""
        latest = self.ticks.book.latest
        self.core.validate(candidate, self.params.values, None if latest is None else latest[1])

    # -- inputs ------------------------------------------------------------------------------
    def _on_obs(self, add, *args) -> None:
        msg = args[-1]
        try:
            obs = add(*args)
        except ros_msgs.MessageError as exc:
            self.ticks.book.stats["bad_observations"] += 1
            self.diag.set("observation", Level.ERROR, f"rejected observation message: {exc}")
            return
        if obs is None:
            return
        stamp = ros_msgs.stamp_ns(msg.header.stamp)
        self.diag.set("observation", Level.OK, "receiving complete observations")
        lockstep = self.params["lockstep"]
        what = self.ticks.book.observe(stamp, obs, lockstep)
        if what == "republish":  # the simulator re-sent a waiting tick: our answer may be lost
            self._republish()
        elif what == "new" and lockstep:
            self._request_tick()

    def _on_episode(self, msg: String) -> None:
        problem = self.ticks.book.episode_message(msg.data)
        if problem:
            self.diag.set("episode", Level.WARN, problem)

    def _on_timer(self) -> None:
        if not self.params["lockstep"]:
            self._request_tick()

    # -- the planning thread -----------------------------------------------------------------
    # A plan takes most of a tick. The executor's callbacks only store the newest observation
    # and wake this thread, which plans and publishes; ticks requested while it plans collapse
    # into one (the newest observation). The executor is single-threaded: rclpy's
    # MultiThreadedExecutor kept a core busy polling its futures (docs/launch.md).
    def _request_tick(self) -> None:
        with self._wake:
            self._tick_requested = True
            self._wake.notify()

    def _planning_loop(self) -> None:
        while True:
            with self._wake:
                while not (self._tick_requested or self._stopping):
                    self._wake.wait()
                if self._stopping:
                    return
                self._tick_requested = False
            try:
                self._tick()
            except Exception as exc:  # noqa: BLE001 - a failed tick sends nothing; the next may plan
                if not self.context.ok():
                    return  # Ctrl-C shut the context down mid-tick: nothing can be sent any more
                self.ticks.book.stats["failed_plans"] += 1
                self.get_logger().error(f"tick failed: {exc!r}")
                self.diag.set("planning", Level.ERROR, f"tick failed, nothing sent: {exc}")

    def _serve_loads(self) -> None:
        """The loader thread: serves ~/load_model until the context shuts down (Ctrl-C)."""
        spin_quietly(self._loader_executor.spin, self.context)

    def stop_planning(self, timeout_s: float = 5.0) -> None:
        """Stop the planning thread (after its current tick); before destroying the node."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._planning_thread.is_alive() and threading.current_thread() is not (
            self._planning_thread
        ):
            self._planning_thread.join(timeout_s)

    def destroy_node(self) -> None:
        self.stop_planning()
        if hasattr(self, "_loader_executor"):
            self._loader_executor.shutdown()
        if hasattr(self, "loader"):
            self.loader.destroy_node()
        super().destroy_node()

    # -- the control step --------------------------------------------------------------------
    def _tick(self) -> None:
        with self._tick_lock:
            self._apply_params()
            self._step()

    def _step(self) -> None:
        p = self.params.values
        tick = self.ticks.tick(p, self.get_clock().now().nanoseconds)
        if tick is None:
            return
        if tick.skipped:
            self.diag.set("planning", Level(tick.level), tick.status)
            return
        if tick.chunk is None:
            self._publish_hold(tick.stamp, tick.period)  # tick.error says why there is no plan
        else:
            self._publish(tick, tick.chunk)
        self.ticks.sent(tick, self.get_clock().now().nanoseconds, p["min_answer_share"])
        self.diag.set("planning", Level(tick.level), tick.status, **self.ticks.report())

    def _await_matched(self, timeout_s: float = 2.0) -> None:
        """Lockstep: wait (bounded) until every subscriber the graph knows is matched to our
        outputs.

        The simulator waits for us anyway, and an answer published before, say, the recorder has
        matched would be missing from the episode bag."""
        deadline = time.monotonic() + timeout_s
        pubs = (self._pub_action, self._pub_plan, self._pub_values)
        while time.monotonic() < deadline and any(
            p.get_subscription_count() < self.count_subscribers(p.topic_name) for p in pubs
        ):
            time.sleep(0.005)

    def _publish(self, tick: Tick, chunk: np.ndarray) -> None:
        """The action (chunk[0]), the plan and, from MPPI, the rewards and values along it."""
        if self.params["lockstep"]:
            self._await_matched()
        stamp, rewards, values, period = tick.stamp, tick.rewards, tick.values, tick.period
        spec = self.core.spec
        if spec is None:
            raise RuntimeError("no model installed: nothing to publish")
        names, kind = ros_msgs.action_names(spec.name), spec.command_kind
        action = ros_msgs.command_to_msg(Command(kind, chunk[0]), names, stamp, period)
        self._pub_action.publish(action)
        plan = ros_msgs.command_to_msg(Command(kind, chunk[0]), names, stamp, period)
        plan.points = [
            JointTrajectoryPoint(
                positions=row.astype(np.float64).tolist(),
                time_from_start=ros_msgs.duration_msg((k + 1) * period),
            )
            for k, row in enumerate(chunk)
        ]
        self._pub_plan.publish(plan)
        self._answer = (action, plan)
        if rewards is not None and values is not None:
            msg = JointTrajectory(joint_names=["reward", "value"])
            msg.header.stamp = ros_msgs.stamp_msg(stamp)
            msg.header.frame_id = "mppi"
            msg.points = [
                JointTrajectoryPoint(
                    positions=[float(r), float(v)],
                    time_from_start=ros_msgs.duration_msg((k + 1) * period),
                )
                for k, (r, v) in enumerate(zip(rewards, values))
            ]
            self._pub_values.publish(msg)

    def _publish_hold(self, stamp: int, period: float) -> None:
        """The explicit safe answer to an observation that could not be planned on (no plan is
        sent)."""
        hold = ros_msgs.command_to_msg(
            Command(CommandKind.HOLD), ros_msgs.action_names(self.core.robot), stamp, period
        )
        self._pub_action.publish(hold)
        self._answer = (hold, None)

    def _republish(self) -> None:
        """Send the last answer again (its stamp is the re-sent tick's: TickBook.observe)."""
        if self._answer is not None:
            self._pub_action.publish(self._answer[0])
            if self._answer[1] is not None:
                self._pub_plan.publish(self._answer[1])


def main(args=None):
    with rclpy.init(args=args):
        try:
            node = PlannerNode()
        except ValueError as exc:  # a start-up error the user can fix: one line, no traceback
            print(exc, file=sys.stderr)
            raise SystemExit(1) from None
        # The node's own threads plan and serve ~/load_model; this executor serves the observations,
        # parameters and the timer, callbacks that return at once (docs/launch.md).
        executor = SingleThreadedExecutor()
        executor.add_node(node)

        def stop() -> None:
            node.stop_planning()
            executor.shutdown()

        spin_until_shutdown(node, executor.spin, on_exit=stop)


if __name__ == "__main__":
    main()
