"""The fault tests' oracle for the robot topic: what reached the Go2 driver was safe.

The limits are copied here as literals from docs/safety.md ("The Go2 limits the oracle
checks"), not imported from `robot_drivers`: a regression that moves a limit in the code under
test cannot move the oracle with it.

`SafetyOracle` listens, in a probe node, to `/simdist/safe_command` (what reached the driver),
`/simdist/robot/applied_command` (what the driver applied) and `/clock`, each message with the
wall time it arrived. `check()` then asserts:

- every command is HOLD, DAMP or a joint_position command of 12 finite joint targets inside the
  joint-target limits (safe and applied);
- every forwarded joint_position command answers an observation at most `max_command_age_s`
  old and stamped at most that far ahead of the clock when it was forwarded: some `/clock`
  reading within CLOCK_WINDOW_S of wall time of its arrival is within `max_command_age_s` of
  its stamp (a lockstep driver drops any other, so only the supervisor's output shows it);
- consecutive applied joint targets step at most `max_target_step`, the first one after an
  applied HOLD measured from the standing pose (HOLD's target); after DAMP nothing is held (the
  joints go limp), so the first target after it is measured from the joint positions the driver
  measured in the observation it answers (`/simdist/robot/proprio`, `joint_pos[i]` relative to
  the standing pose).
"""

from __future__ import annotations

import time

import numpy as np
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import JointState
from trajectory_msgs.msg import JointTrajectory

# --- docs/safety.md, "The Go2 limits the oracle checks" --------------------------------------
STANDING_POSE = (-0.1, 0.8, -1.5, 0.1, 0.8, -1.5, -0.1, 1.0, -1.5, 0.1, 1.0, -1.5)  # rad
ACTION_SCALE = 0.25  # joint target = STANDING_POSE + ACTION_SCALE * command value
TARGET_LOW = (-1.3472, -1.8708, -3.0227, -1.3472, -1.8708, -3.0227,
              -1.3472, -0.8236, -3.0227, -1.3472, -0.8236, -3.0227)  # fmt: skip
TARGET_HIGH = (1.3472, 3.7907, -0.53776, 1.3472, 3.7907, -0.53776,
               1.3472, 4.8379, -0.53776, 1.3472, 4.8379, -0.53776)  # fmt: skip
MAX_TARGET_STEP = 1.0  # rad per control step
MAX_COMMAND_AGE_S = 0.5  # the supervisor's default; the Go2 graphs use 0.06
# ------------------------------------------------------------------------------------------------
# Wall-time window around a command's arrival whose /clock readings stand for "the clock when it
# was forwarded": the probe's executor may hand over the command and the clock messages around
# it in either order, a few ticks apart. A lockstep chain runs well under 25 ticks (0.5 s of sim
# time) in this window, so a command half a second late or ahead is never within it.
CLOCK_WINDOW_S = 0.1
TOLERANCE = 1e-5  # rad: float32 on the wire

APPLIED_TOPIC = "/simdist/robot/applied_command"
SAFE_TOPIC = "/simdist/safe_command"
MEASURED_TOPIC = "/simdist/robot/proprio"
JOINT_POS_NAMES = [f"joint_pos[{i}]" for i in range(12)]  # relative to STANDING_POSE


def target(msg: JointTrajectory) -> np.ndarray:
    """The joint targets a joint_position command sets."""
    return np.asarray(STANDING_POSE) + ACTION_SCALE * np.asarray(msg.points[0].positions)


def stamp_ns(stamp) -> int:
    return stamp.sec * 1_000_000_000 + stamp.nanosec


class SafetyOracle:
    """Records the robot topics in `node` (a probe on the graph's domain) for `check()`."""

    def __init__(self, node, depth: int = 1000, wall_clock: bool = False):
        """`wall_clock`: the graph runs on the system clock (a real-time driver, no /clock); the
        clock reading of a command is then the system time it arrived."""
        self.wall_clock = wall_clock
        self.arrival_ns: dict[int, int] = {}  # id(message) -> system time it arrived (wall_clock)
        self.safe: list[tuple[float, JointTrajectory]] = []
        self.applied: list[tuple[float, JointTrajectory]] = []
        self.clock: list[tuple[float, int]] = []
        self.measured: dict[int, np.ndarray] = {}  # stamp -> measured joint positions (finite)
        node.create_subscription(JointState, MEASURED_TOPIC, self._on_measured, depth)
        node.create_subscription(JointTrajectory, SAFE_TOPIC, self._on_safe, depth)
        node.create_subscription(JointTrajectory, APPLIED_TOPIC, self._on(self.applied), depth)
        node.create_subscription(
            Clock,
            "/clock",
            lambda m: self.clock.append((time.monotonic(), stamp_ns(m.clock))),
            depth,
        )

    def _on_safe(self, msg: JointTrajectory) -> None:
        self.safe.append((time.monotonic(), msg))
        if self.wall_clock:
            self.arrival_ns[id(msg)] = time.time_ns()

    def _on_measured(self, msg: JointState) -> None:
        index = {name: i for i, name in enumerate(msg.name)}
        if len(msg.name) != len(msg.position) or not all(n in index for n in JOINT_POS_NAMES):
            return
        pose = np.asarray(STANDING_POSE) + [msg.position[index[n]] for n in JOINT_POS_NAMES]
        if np.all(np.isfinite(pose)):  # the first finite one: a test may inject a NaN copy
            self.measured.setdefault(stamp_ns(msg.header.stamp), pose)

    @staticmethod
    def _on(log: list):
        return lambda msg: log.append((time.monotonic(), msg))

    def check(
        self,
        max_command_age_s: float = MAX_COMMAND_AGE_S,
        max_target_step: float = MAX_TARGET_STEP,
        ignore=lambda msg: False,
    ) -> None:
        """Assert the rules above over everything recorded; `ignore(msg)` leaves out a test's
        own injected messages."""
        safe = [(t, m) for t, m in self.safe if not ignore(m)]
        applied = [(t, m) for t, m in self.applied if not ignore(m)]
        for topic, log in ((SAFE_TOPIC, safe), (APPLIED_TOPIC, applied)):
            for _, msg in log:
                _check_command(topic, msg)
        for arrived, msg in safe:
            if msg.header.frame_id == "joint_position":
                self._check_age(arrived, msg, max_command_age_s)
        _check_steps([m for _, m in applied], max_target_step, self.measured)

    def _check_age(self, arrived: float, msg: JointTrajectory, limit_s: float) -> None:
        stamp = stamp_ns(msg.header.stamp)
        if self.wall_clock:
            readings = [self.arrival_ns[id(msg)]]
        else:
            before = [c for t, c in self.clock if t < arrived - CLOCK_WINDOW_S]
            near = [c for t, c in self.clock if abs(t - arrived) <= CLOCK_WINDOW_S]
            readings = before[-1:] + near
        assert readings, f"no /clock reading around a forwarded command stamped {stamp} ns"
        ages = [(c - stamp) * 1e-9 for c in readings]
        assert any(abs(a) <= limit_s + 1e-9 for a in ages), (
            f"forwarded a joint_position command stamped {stamp * 1e-9:.3f} s while the clock "
            f"read {min(readings) * 1e-9:.3f}..{max(readings) * 1e-9:.3f} s: "
            + ("older" if min(ages) > 0 else "ahead")
            + f" than max_command_age_s={limit_s}"
        )


def _check_command(topic: str, msg: JointTrajectory) -> None:
    kind = msg.header.frame_id
    assert kind in ("hold", "damp", "joint_position"), f"{topic}: unknown command kind {kind!r}"
    if kind != "joint_position":
        return
    assert msg.points and len(msg.points[0].positions) == 12, f"{topic}: not 12 joint targets"
    goal = target(msg)
    assert np.all(np.isfinite(goal)), f"{topic}: non-finite command reached the robot: {goal}"
    low, high = np.asarray(TARGET_LOW), np.asarray(TARGET_HIGH)
    outside = np.flatnonzero((goal < low - TOLERANCE) | (goal > high + TOLERANCE))
    assert not outside.size, (
        f"{topic}: joint targets outside the joint-target limits at joints {outside.tolist()}: "
        f"{goal[outside].tolist()}"
    )


def _check_steps(
    applied: list[JointTrajectory], max_step: float, measured: dict[int, np.ndarray]
) -> None:
    previous = None  # nothing applied yet: no target to measure from
    for msg in applied:
        kind = msg.header.frame_id
        if kind == "hold":
            previous = np.asarray(STANDING_POSE)
            continue
        if kind == "damp":
            previous = "damp"
            continue
        goal = target(msg)
        if isinstance(previous, str):  # after DAMP: from the measured joint positions
            stamp = stamp_ns(msg.header.stamp)
            assert stamp in measured, f"no measured joint positions stamped {stamp} ns"
            step = float(np.max(np.abs(goal - measured[stamp])))
            assert step <= max_step + TOLERANCE, (
                f"applied step {step:.3f} rad from the measured pose after DAMP > "
                f"max_target_step {max_step} (at {stamp} ns)"
            )
        elif previous is not None:
            step = float(np.max(np.abs(goal - previous)))
            assert step <= max_step + TOLERANCE, (
                f"applied step {step:.3f} rad > max_target_step {max_step} "
                f"(at {stamp_ns(msg.header.stamp)} ns)"
            )
        previous = goal
