"""The safety supervisor's pure core: every command passes here before any driver sees it.

Checks, in order: NaN / Inf, e-stop latch, stale observation, the command's age (the age of the
observation it answers), command kind / size, then the robot's limits, chosen by what its actions
are (`RobotSpec.command_kind`): end-effector deltas (UR5e) get step caps and a workspace box on
the predicted TCP; joint targets (Go2) get joint-target limits and a per-tick target step limit.
A command-rate watchdog turns a missing plan into HOLD, and, after a grace period, into DAMP on a
robot for which DAMP is a mode of its own (`RobotSpec.damping_mode`: the quadruped). The robot's
kind, action size and damping come from its `RobotSpec` (`robot_drivers.specs`), never from its
name. The ROS node (`safety_node.py`) only moves messages in and out of this class; every rule is
testable here without ROS.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from robot_drivers.described import setting
from robot_drivers.interface import Command, CommandKind, RobotSpec
from robot_drivers.specs import robot_spec

# The joint-target limits are the robot's joint range (RobotSpec.joint_low / joint_high) widened
# by this margin (rad). A PD target past a stop only sets how hard the joint presses on it, and a
# walking gait does that: the official Go2 model's gait (docs/official_model.md) puts calf targets
# up to 0.16 rad past their upper stop on about half of its steps. The margin keeps about twice
# that, so the limits catch garbage, not the gait.
GO2_TARGET_MARGIN = 0.3
# Largest joint-target change per control step (rad): the same gait steps its calf targets by up
# to 0.67 rad in 20 ms; 1.0 leaves 1.5x that.
GO2_MAX_TARGET_STEP = 1.0
MEASURED_KEPT = 50  # measured joint poses kept, by observation stamp (1 s of Go2 ticks)


def joint_target_limits(
    spec: RobotSpec, margin: float = GO2_TARGET_MARGIN
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The default joint-target limits of a joint-target robot: its joint range widened by a margin.

    Args:
        spec: the robot's RobotSpec (its joint_low, joint_high).
        margin: rad added on both sides.

    Returns:
        (low, high) per joint, rounded to 5 decimals; ((), ()) for a robot without joint ranges.
    """
    low = tuple(round(v - margin, 5) for v in spec.joint_low)
    high = tuple(round(v + margin, 5) for v in spec.joint_high)
    return low, high


# The Go2's facts as the supervisor uses them, all read from its RobotSpec (robot_drivers.go2).
_GO2 = robot_spec("go2")
GO2_DEFAULT_POSE = _GO2.default_pose
GO2_JOINT_LOW, GO2_JOINT_HIGH = _GO2.joint_low, _GO2.joint_high
GO2_TARGET_LOW, GO2_TARGET_HIGH = joint_target_limits(_GO2)


@dataclass
class SafetyConfig:
    """Limits and timeouts of one robot. Times are seconds on the node clock (sim time in
    lockstep). What a command means (its kind, size, a joint-target robot's default pose and
    action scale) is the robot's RobotSpec's, never a setting here."""

    robot: str = "ur5e"  # a robot of robot_drivers.specs; its RobotSpec says what the rest means
    # Each setting's description (doc, range) is the supervisor node's parameter
    # (robot_drivers.described); `group` names the command kind whose limit it is.
    command_timeout_s: float = field(
        default=0.5,
        metadata=setting(
            "no fresh plan for this long -> safe action (keep above one control period)",
            low=0.01,
            high=10.0,
        ),
    )
    damp_grace_s: float = field(
        default=0.2,
        metadata=setting(
            "a robot with a DAMP mode (Go2): stand (HOLD) this long after a plan timeout, "
            "then DAMP",
            low=0.0,
            high=10.0,
        ),
    )
    observation_timeout_s: float = field(
        default=0.5,
        metadata=setting("newest observation older than this -> safe action", low=0.01, high=10.0),
    )
    # A command carries the stamp of the observation it answers. One whose stamp is further than
    # this from the node clock, in the past (a late plan) or the future (a command of another
    # episode after a clock reset, a clock jump), is not forwarded: the safe action goes instead.
    max_command_age_s: float = field(
        default=0.5,
        metadata=setting(
            "a command whose stamp (the observation it answers) is further than this from the "
            "node clock, late or ahead -> safe action",
            low=0.001,
            high=10.0,
        ),
    )
    # end-effector deltas (EE_DELTA: the UR5e)
    max_step_pos: float = field(
        default=0.03,
        metadata=setting(
            "max TCP translation per control step (m)", low=0.001, high=0.2, group="ee_delta"
        ),
    )
    max_step_rot: float = field(
        default=0.25,
        metadata=setting(
            "max TCP rotation per control step (rad)", low=0.01, high=1.5, group="ee_delta"
        ),
    )
    workspace_low: tuple[float, float, float] = field(
        default=(-0.45, 0.10, 0.01),
        metadata=setting("TCP box lower corner x, y, z (m, base frame)", group="ee_delta"),
    )
    workspace_high: tuple[float, float, float] = field(
        default=(0.55, 0.90, 0.70),
        metadata=setting("TCP box upper corner x, y, z (m, base frame)", group="ee_delta"),
    )
    # joint targets (JOINT_POSITION: the Go2)
    max_target_step: float = field(
        default=GO2_MAX_TARGET_STEP,
        metadata=setting(
            "max joint-target change per control step (rad)",
            low=0.01,
            high=3.0,
            group="joint_position",
        ),
    )
    joint_low: tuple[float, ...] = field(  # () = joint_target_limits of the robot's spec
        default=(),
        metadata=setting(
            "lower joint-target limits (rad, the robot's joint order): the joint range less a "
            "margin",
            group="joint_position",
        ),
    )
    joint_high: tuple[float, ...] = field(
        default=(),
        metadata=setting(
            "upper joint-target limits (rad, the robot's joint order): the joint range plus a "
            "margin",
            group="joint_position",
        ),
    )

    def __post_init__(self) -> None:
        self._spec = robot_spec(self.robot)  # ValueError naming the known robots
        default_low, default_high = joint_target_limits(self._spec)
        self.joint_low = tuple(self.joint_low) or default_low
        self.joint_high = tuple(self.joint_high) or default_high
        for name in (
            "command_timeout_s",
            "observation_timeout_s",
            "max_command_age_s",
            "max_step_pos",
            "max_step_rot",
            "max_target_step",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"SafetyConfig.{name} must be > 0, got {getattr(self, name)}")
        if not self.damp_grace_s >= 0:
            raise ValueError(f"SafetyConfig.damp_grace_s must be >= 0, got {self.damp_grace_s}")
        if (
            len(self.workspace_low) != 3
            or len(self.workspace_high) != 3
            or not all(lo < hi for lo, hi in zip(self.workspace_low, self.workspace_high))
        ):
            raise ValueError(
                "workspace box needs 3 values each with low < high, "
                f"got {self.workspace_low} / {self.workspace_high}"
            )
        joints = self._spec.action_dim if self.action_kind == CommandKind.JOINT_POSITION else None
        for name in ("joint_low", "joint_high"):
            if joints is not None and len(getattr(self, name)) != joints:
                raise ValueError(
                    f"SafetyConfig.{name} needs {joints} values ({self.robot} joints), "
                    f"got {len(getattr(self, name))}"
                )
        if not all(lo < hi for lo, hi in zip(self.joint_low, self.joint_high)):
            raise ValueError("SafetyConfig.joint_low must be below joint_high for every joint")

    @property
    def spec(self) -> RobotSpec:
        """The robot's spec (default backend settings)."""
        return self._spec

    @property
    def default_pose(self) -> tuple[float, ...]:
        """A joint-target robot's joint target for action 0 (its RobotSpec's)."""
        return self._spec.default_pose

    @property
    def action_scale(self) -> float:
        """joint target = default_pose + action_scale * action (its RobotSpec's)."""
        return self._spec.action_scale

    @property
    def action_kind(self) -> CommandKind:
        return self._spec.command_kind

    @property
    def action_dim(self) -> int:
        return self._spec.action_dim


def stale_command_reason(stamp: float, now: float, max_age_s: float) -> str | None:
    """Why a command must not act now: it is more than `max_age_s` late, or that far ahead of the
    clock (another episode after a clock reset, a clock jump). The supervisor and the hardware
    drivers both apply it.

    Args:
        stamp: the command's stamp (the observation it answers), s.
        now: the node clock, s.
        max_age_s: the largest age allowed either way.

    Returns:
        The reason, or None when it may act.
    """
    age = now - stamp
    if abs(age) <= max_age_s:
        return None
    when = f"{age:.3f} s old" if age > 0 else f"{-age:.3f} s ahead of the node clock"
    return (
        f"command answers the observation stamped {stamp:.3f} s, {when} "
        f"(limit max_command_age_s={max_age_s})"
    )


@dataclass
class Decision:
    """What the supervisor forwards and why (reason empty when the command passed unchanged)."""

    command: Command
    status: (
        str  # "pass", "clipped", "rejected", "estop", "stale_observation", "stale_command",
        # "duplicate", "watchdog", "no_answer"
    )
    reason: str = ""
    clipped: list[str] = field(default_factory=list)


class AnswerDeadline:
    """Which observation the planner has left unanswered, and since when (wall time).

    An observation newer than every answered one opens the deadline; an answer to an
    observation seen (stamped at most the newest one) closes every deadline up to its stamp.
    An answer stamped ahead of every observation (another episode, a clock jump) counts for
    nothing: it would mark ticks answered that the deadline then would not cover."""

    def __init__(self) -> None:
        self._open: tuple[int, float] | None = None  # (observation stamp ns, wall time seen)
        self._answered_ns = -1
        self._newest_ns = -1

    def observed(self, stamp_ns: int, now: float) -> None:
        """An observation stamped `stamp_ns` arrived at wall time `now` (s).

        Args:
            stamp_ns: the observation's stamp.
            now: the wall time it arrived (s), on the clock `due` is asked with.

        Returns:
            None; the deadline waits for the newest unanswered observation.
        """
        self._newest_ns = max(self._newest_ns, stamp_ns)
        if stamp_ns > self._answered_ns and (self._open is None or stamp_ns > self._open[0]):
            self._open = (stamp_ns, now)

    def answered(self, stamp_ns: int) -> None:
        """A plan stamped `stamp_ns` arrived.

        Args:
            stamp_ns: the plan's stamp (the observation it answers).

        Returns:
            None; the deadline closes if the plan answers the observation it waits for.
        """
        if stamp_ns <= self._newest_ns:
            self._answered_ns = max(self._answered_ns, stamp_ns)
            if self._open is not None and stamp_ns >= self._open[0]:
                self._open = None

    def due(self, now: float, limit_s: float) -> int | None:
        """The stamp of the observation left unanswered for `limit_s` or longer, once: the
        caller sends the safe action for its tick, which counts as its answer.

        Args:
            now: the wall time (s).
            limit_s: the answer timeout (s); 0 turns the deadline off.

        Returns:
            The overdue observation's stamp (ns), or None.
        """
        if not limit_s or self._open is None or now - self._open[1] < limit_s:
            return None
        stamp_ns = self._open[0]
        self._answered_ns, self._open = stamp_ns, None
        return stamp_ns


class SafetySupervisor:
    """Stateful filter between planner and driver."""

    def __init__(self, config: SafetyConfig):
        self.config = config
        self.estopped = False
        self.last_command_time: float | None = None  # node time of the last accepted plan
        self.last_observation_stamp: float | None = None
        self.tcp_pos: np.ndarray | None = None
        # Go2 step limiter. Its reference is what the driver reports applied, not what was
        # forwarded: a forwarded command the driver drops (a lockstep tick already answered, a
        # stale stamp) must not move the limit. Targets forwarded since the last report are kept
        # too, so whichever of them the driver applies next, the step from the previous applied
        # one stays within max_target_step.
        self._applied_target: np.ndarray | None = None  # None: no target (damping, none yet)
        self._applied_stamp = -np.inf
        # Measured joint positions (absolute, rad) by observation stamp, the newest few: with no
        # applied target (none yet, or after DAMP, when the joints went limp) a target steps
        # from where the joints are, too.
        self._measured: dict[float, np.ndarray] = {}
        self._pending: list[tuple[float, np.ndarray]] = []  # (stamp, target) not yet reported
        self._timeout_since: float | None = None
        self._last_decision: Decision | None = None  # of the newest command filtered

    # --- inputs ------------------------------------------------------------------------------
    def observation(self, stamp: float, joint_pos_rel=None) -> None:
        """An observation arrived. A measured pose of the wrong size or with NaN / Inf is not kept.

        Args:
            stamp: its stamp, s (the newest stamp seen is kept).
            joint_pos_rel: on a joint-target robot, its measured joint positions relative to
                default_pose (the proprio's joint_pos term); None: not measured.

        Returns:
            None.
        """
        self.last_observation_stamp = (
            stamp
            if self.last_observation_stamp is None
            else max(stamp, self.last_observation_stamp)
        )
        if joint_pos_rel is None or self.config.action_kind != CommandKind.JOINT_POSITION:
            return
        rel = np.asarray(joint_pos_rel, dtype=np.float64)
        if rel.shape == (self.config.action_dim,) and np.all(np.isfinite(rel)):
            self._measured[stamp] = np.asarray(self.config.default_pose) + rel
            while len(self._measured) > MEASURED_KEPT:
                del self._measured[min(self._measured)]

    def tcp_pose(self, pos) -> None:
        """The measured TCP position (an end-effector robot's workspace box is checked against it).

        Args:
            pos: (x, y, z) in m; a value of another shape or with NaN / Inf leaves no pose.

        Returns:
            None.
        """
        pos = np.asarray(pos, dtype=np.float64)
        self.tcp_pos = pos if pos.shape == (3,) and np.all(np.isfinite(pos)) else None

    def estop(self) -> None:
        """Latch the e-stop: every command becomes the damping command until `resume`.

        Returns:
            None.
        """
        self.estopped = True

    def resume(self, now: float) -> str | None:
        """Release the e-stop (refused while observations are stale); the step limiter starts
        afresh.

        Args:
            now: the node clock, s.

        Returns:
            The refusal reason, or None when resumed.
        """
        if self.observation_stale(now):
            return self._stale_reason(now) + "; resume refused until observations are fresh"
        self.estopped = False
        self._applied_target, self._pending = None, []
        self._timeout_since = None
        self._last_decision = None
        self.last_command_time = None
        return None

    # --- checks ------------------------------------------------------------------------------
    def observation_stale(self, now: float) -> bool:
        """Whether the newest observation is too old to command on.

        Args:
            now: the node clock, s.

        Returns:
            True when none arrived or it is older than observation_timeout_s.
        """
        return (
            self.last_observation_stamp is None
            or now - self.last_observation_stamp > self.config.observation_timeout_s
        )

    def _stale_reason(self, now: float) -> str:
        if self.last_observation_stamp is None:
            return "no observation received yet"
        return (
            f"newest observation is {now - self.last_observation_stamp:.3f} s old "
            f"(limit observation_timeout_s={self.config.observation_timeout_s})"
        )

    def safe_command(self, stamp: float, damp: bool = False) -> Command:
        """The command that stops the robot.

        Args:
            stamp: the stamp it carries.
            damp: DAMP where the robot has a damping mode (else HOLD).

        Returns:
            The HOLD or DAMP Command.
        """
        kind = CommandKind.DAMP if (damp and self.config.spec.damping_mode) else CommandKind.HOLD
        return Command(kind=kind, stamp=stamp)

    def applied(self, command: Command) -> None:
        """The driver reports the command it applied (its stamp is the observation it answers): the
        step limiter's reference (joint-target robots) moves to it. HOLD makes the Go2 stand (its
        target is the default pose, in sim and on the robot), so the next step is measured from
        there; DAMP has no target (zero stiffness): the next is measured from the joint positions
        measured when it is filtered. Forwarded targets with a stamp at or before it can no longer
        be applied and are forgotten; a report older than the newest is ignored.

        Args:
            command: the command applied.

        Returns:
            None.
        """
        if command.stamp < self._applied_stamp:
            return  # an older report overtaken by a newer one
        self._applied_stamp = command.stamp
        self._pending = [(s, t) for s, t in self._pending if s > command.stamp]
        default = np.asarray(self.config.default_pose)
        joints = self.config.action_kind == CommandKind.JOINT_POSITION
        if not joints or command.kind == CommandKind.DAMP:
            self._applied_target = None
        elif command.kind == CommandKind.HOLD:
            self._applied_target = self._hold_target()
        else:
            values = np.asarray(command.values, dtype=np.float64)
            self._applied_target = default + self.config.action_scale * values

    def _hold_target(self) -> np.ndarray | None:
        """Guard: the Go2's joint target while it holds (stands), the step limiter's reference
        after an applied HOLD."""
        return np.asarray(self.config.default_pose)

    def filter(self, command: Command, now: float) -> Decision:
        """Check one planner command. A second command for the observation the previous one answered
        (the same stamp: the planner re-sends its answer when a lockstep simulator re-sends a tick)
        gets the previous decision again, status "duplicate". Limits are applied once per
        observation: filtering a clipped command twice would advance the step limiter past what the
        driver applied.

        Args:
            command: the planner's command.
            now: the node time it was received at, s.

        Returns:
            The Decision: the command to forward (clipped, or HOLD / DAMP instead), its status and
            the reason.
        """
        if command.kind not in (CommandKind.HOLD, CommandKind.DAMP):
            # first, so that a NaN re-send of an answered observation gets HOLD too
            non_finite = self._non_finite_reason(np.asarray(command.values, dtype=np.float64))
            if non_finite:
                return self.reject(command.stamp, non_finite)
        last = self._last_decision
        if last is not None and not self.estopped and command.stamp == last.command.stamp:
            return Decision(
                last.command,
                "duplicate",
                f"a second command for the observation stamped {command.stamp:.3f} s: the first "
                f"decision ({last.status}) is sent again",
                last.clipped,
            )
        decision = self._filter(command, now)
        if decision.status != "estop":
            self._last_decision = decision
        return decision

    def _filter(self, command: Command, now: float) -> Decision:
        stamp = command.stamp
        if self.estopped:
            return Decision(
                self.safe_command(stamp, damp=True), "estop", "e-stop latched; call ~/resume"
            )
        if self.observation_stale(now):
            return Decision(self.safe_command(stamp), "stale_observation", self._stale_reason(now))
        if command.kind in (CommandKind.HOLD, CommandKind.DAMP):
            self.last_command_time = now
            self._timeout_since = None
            return Decision(self.safe_command(stamp, damp=command.kind == CommandKind.DAMP), "pass")
        stale = self._stale_reason_of(stamp, now)
        if stale:
            return Decision(self.safe_command(stamp), "stale_command", stale)
        if command.kind != self.config.action_kind:
            return self.reject(
                stamp,
                f"command kind {command.kind.value!r}, expected {self.config.action_kind.value!r}",
            )
        values = np.asarray(command.values, dtype=np.float64)
        if values.shape != (self.config.action_dim,):
            return self.reject(
                stamp, f"command has shape {values.shape}, expected ({self.config.action_dim},)"
            )
        if self.config.action_kind == CommandKind.EE_DELTA:
            decision = self._limit_ee(values, stamp)
        else:
            decision = self._limit_joints(values, stamp)
        if decision.status != "rejected":
            self.last_command_time = now
            self._timeout_since = None
        return decision

    def watchdog(self, now: float) -> Decision | None:
        """The watchdog's check, called by the node's timer.

        Args:
            now: the node clock, s.

        Returns:
            The safe command's Decision when the e-stop is latched or no fresh plan arrived within
            command_timeout_s (DAMP once the timeout lasted damp_grace_s, where the robot has it);
            None otherwise.
        """
        if self.estopped:
            return Decision(
                self.safe_command(now, damp=True), "estop", "e-stop latched; call ~/resume"
            )
        if self.last_command_time is None or not self._plan_timed_out(now):
            return None
        if self._timeout_since is None:
            self._timeout_since = now
        damp = self._damp_due(now)
        reason = (
            f"no plan for {now - self.last_command_time:.3f} s "
            f"(limit command_timeout_s={self.config.command_timeout_s})"
        )
        return Decision(self.safe_command(now, damp=damp), "watchdog", reason)

    # --- guards (each one method, so that a test can show the fault oracle catches its loss) ---
    def _plan_timed_out(self, now: float) -> bool:
        """Guard (watchdog): no plan accepted for command_timeout_s: the safe action."""
        last = self.last_command_time
        return last is not None and now - last > self.config.command_timeout_s

    def _damp_due(self, now: float) -> bool:
        """Guard (DAMP): the watchdog has held for damp_grace_s: damp (where DAMP is a mode)."""
        return self._timeout_since is not None and now - self._timeout_since > (
            self.config.damp_grace_s
        )

    def _measured_reference(self, stamp: float) -> np.ndarray | None:
        """Guard: with no applied target (none yet, or DAMP applied), the step limiter measures
        from the joint positions measured in the observation the command answers (the newest
        one if that is unknown), besides the targets forwarded since; None before any
        measurement. (In the simulator DAMP also ends the episode and the robot is reset to
        standing: the measured pose says so, the last target does not.)"""
        if not self._measured:
            return None
        return self._measured.get(stamp, self._measured[max(self._measured)])

    @staticmethod
    def _another_source(low: np.ndarray, high: np.ndarray) -> bool:
        """Guard: no target is within max_target_step of every reference (the applied target
        and those forwarded since): the robot applied a target this supervisor never sent."""
        return bool(np.any(low > high))

    def _stale_reason_of(self, stamp: float, now: float) -> str | None:
        """Guard: a command answering an observation too old, or stamped ahead of the clock."""
        return stale_command_reason(stamp, now, self.config.max_command_age_s)

    @staticmethod
    def _non_finite_reason(values: np.ndarray) -> str | None:
        """Guard: NaN or Inf in a command."""
        if np.all(np.isfinite(values)):
            return None
        return f"command contains NaN or Inf: {values.tolist()}"

    def _clip_to_range(self, target: np.ndarray) -> np.ndarray:
        """Guard: Go2 joint targets inside joint_low / joint_high."""
        return np.clip(target, self.config.joint_low, self.config.joint_high)

    def _clip_step(self, target: np.ndarray, stamp: float) -> np.ndarray | None:
        """Guard: the Go2 target within max_target_step of the applied target and of every
        target forwarded since (whichever of them the driver applies next); None when those
        references are further apart than 2 x max_target_step (another command source)."""
        c = self.config
        # Forwarded targets older than max_command_age_s can no longer be applied by any driver.
        self._pending = [(s, t) for s, t in self._pending if stamp - s <= c.max_command_age_s]
        references = [t for _, t in self._pending]
        if self._applied_target is not None:
            references.append(self._applied_target)
        else:  # nothing held (none yet, DAMP): from the joints where they are, measured
            measured = self._measured_reference(stamp)
            if measured is not None:
                references.append(measured)
        if not references:
            return target
        low = np.max(references, axis=0) - c.max_target_step
        high = np.min(references, axis=0) + c.max_target_step
        if self._another_source(low, high):
            return None
        return np.clip(target, low, high)

    # --- robot limits ------------------------------------------------------------------------
    def reject(self, stamp: float, reason: str) -> Decision:
        """Refuse a command.

        Args:
            stamp: the refused command's stamp.
            reason: why.

        Returns:
            A "rejected" Decision forwarding HOLD, with the reason.
        """
        return Decision(self.safe_command(stamp), "rejected", reason)

    def _limit_ee(self, values: np.ndarray, stamp: float) -> Decision:
        c = self.config
        out = values.copy()
        clipped = []
        d, r = out[:3], out[3:6]
        if np.linalg.norm(d) > c.max_step_pos:
            d *= c.max_step_pos / np.linalg.norm(d)
            clipped.append("max_step_pos")
        if np.linalg.norm(r) > c.max_step_rot:
            r *= c.max_step_rot / np.linalg.norm(r)
            clipped.append("max_step_rot")
        if self.tcp_pos is None:
            return self.reject(
                stamp, "no TCP pose on /tcp_pose yet: cannot check the workspace box"
            )
        target = self.tcp_pos + d
        boxed = np.clip(target, c.workspace_low, c.workspace_high)
        if not np.allclose(boxed, target):
            d[:] = boxed - self.tcp_pos
            clipped.append("workspace")
        gripper = float(np.clip(out[6], 0.0, 1.0))
        if gripper != out[6]:
            clipped.append("gripper")
        out[6] = gripper
        cmd = Command(CommandKind.EE_DELTA, out.astype(np.float32), stamp)
        return Decision(cmd, "clipped" if clipped else "pass", ", ".join(clipped), clipped)

    def _limit_joints(self, values: np.ndarray, stamp: float) -> Decision:
        c = self.config
        default = np.asarray(c.default_pose)
        target = default + c.action_scale * values
        clipped = []
        bounded = self._clip_to_range(target)
        if not np.allclose(bounded, target):
            clipped.append("joint_limits")
        stepped = self._clip_step(bounded, stamp)
        if stepped is None:  # the robot applied a target this supervisor never sent
            return self.reject(
                stamp,
                "the applied joint target and the targets forwarded since differ by more "
                f"than 2 x max_target_step={c.max_target_step}: another command source?",
            )
        if not np.allclose(stepped, bounded):
            clipped.append("max_target_step")
        self._pending.append((stamp, stepped))
        action = (stepped - default) / c.action_scale
        cmd = Command(CommandKind.JOINT_POSITION, action.astype(np.float32), stamp)
        return Decision(cmd, "clipped" if clipped else "pass", ", ".join(clipped), clipped)
