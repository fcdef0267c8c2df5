"""What happened in one recorded episode: its outcome and what the safety supervisor changed.

    simdist-episode-report BAG_DIR [BAG_DIR ...] [--json]

Reads an episode bag written by the recorder node (MCAP, `simdist_adapter.bags`):
- the outcome from the driver's last `/simdist/episode` tick: steps, success, fall, distance and,
  on the Go2, `speed` (mean forward speed over the task's speed window);
- the planner's commands (`/simdist/action`) against the ones the safety supervisor forwarded
  (`/simdist/safe_command`), matched by their observation stamp: how many it changed, by how
  much (in command units; Go2: raw policy actions, joint target = default + 0.25 x action) and
  which commands it replaced by HOLD / DAMP.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass, field

import numpy as np
from rclpy.serialization import deserialize_message
from std_msgs.msg import String
from trajectory_msgs.msg import JointTrajectory

from robot_drivers.ros_msgs import stamp_ns
from simdist_adapter.bags import BagError, EpisodeBag

EPISODE, ACTION, SAFE = "/simdist/episode", "/simdist/action", "/simdist/safe_command"
# A forwarded command that differs from the plan's by more than this (float32 round trip) counts
# as changed.
CHANGE_TOLERANCE = 1e-5


@dataclass(frozen=True)
class EpisodeReport:
    bag: str
    task: str
    seed: int | None
    steps: int
    success: bool
    fallen: bool
    distance: float
    speed: float  # NaN where the task reports none
    commands: int  # planner commands matched with a forwarded one
    changed: int  # of those, forwarded with other values
    replaced: int  # of those, forwarded as HOLD / DAMP instead
    max_change: float  # largest |forwarded - planned| over all elements (command units)
    changed_elements: dict = field(default_factory=dict)  # element name -> times changed


def _values(msg) -> np.ndarray | None:
    """A command message's values; None for HOLD / DAMP (no values)."""
    if not msg.points or len(msg.points[0].positions) == 0:
        return None
    return np.asarray(msg.points[0].positions, dtype=np.float64)


def episode_report(path) -> EpisodeReport:
    """The report of one episode bag; BagError if the bag lacks the topics it needs."""
    with EpisodeBag(path) as bag:
        last, names = None, []
        planned: dict[int, np.ndarray | None] = {}  # plan stamp -> planned action
        forwarded: dict[int, np.ndarray | None] = {}  # plan stamp -> the supervisor's answer
        # decoded with rclpy, as they were published (as simdist_adapter.real_data reads them)
        for m in bag.raw_messages([EPISODE, ACTION, SAFE]):
            if m.topic == EPISODE:
                last = json.loads(deserialize_message(m.data, String).data)
                continue
            msg = deserialize_message(m.data, JointTrajectory)
            if m.topic == ACTION:
                planned[stamp_ns(msg.header.stamp)] = _values(msg)
                names = list(msg.joint_names)
            else:
                # the supervisor's answer to a plan; a later one for the same stamp is a watchdog
                # re-send and does not replace it
                forwarded.setdefault(stamp_ns(msg.header.stamp), _values(msg))
        meta = bag.meta
    if last is None:
        raise BagError(f"{path}: no {EPISODE} message")
    changed, replaced, max_change = 0, 0, 0.0
    per_element: dict[str, int] = {}  # joint / action element -> commands that changed it
    matched = [s for s in planned if s in forwarded and planned[s] is not None]
    for stamp in matched:
        plan, safe = planned[stamp], forwarded[stamp]
        assert plan is not None  # matched keeps the plans with values
        if safe is None:
            replaced += 1
            continue
        diff = np.abs(safe - plan)
        if diff.max() > CHANGE_TOLERANCE:
            changed += 1
            max_change = max(max_change, float(diff.max()))
            for i in np.flatnonzero(diff > CHANGE_TOLERANCE):
                name = names[i] if i < len(names) else str(i)
                per_element[name] = per_element.get(name, 0) + 1
    info = last.get("info", {})
    return EpisodeReport(
        bag=str(path),
        task=meta.task,
        seed=meta.seed,
        steps=int(last.get("step", 0)),
        success=bool(last.get("success")),
        fallen=bool(info.get("fallen", False)),
        distance=float(info.get("distance", math.nan)),
        speed=float(info.get("speed", math.nan)),
        commands=len(matched),
        changed=changed,
        replaced=replaced,
        max_change=max_change,
        changed_elements=per_element,
    )


def format_report(r: EpisodeReport) -> str:
    return (
        f"{r.bag}: {r.task} seed {r.seed}, {r.steps} steps, "
        f"{'success' if r.success else 'failure'}, fallen {r.fallen}, distance {r.distance:.2f} m, "
        f"speed {r.speed:.3f} m/s; safety supervisor: {r.changed} of {r.commands} commands "
        f"changed (max {r.max_change:.4f}), {r.replaced} replaced by HOLD/DAMP"
        + (f", elements {r.changed_elements}" if r.changed_elements else "")
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="simdist-episode-report",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("bags", nargs="+", help="episode bag directories")
    p.add_argument("--json", action="store_true", help="one JSON object per bag")
    a = p.parse_args(argv)
    status = 0
    for path in a.bags:
        try:
            r = episode_report(path)
        except BagError as exc:
            print(f"simdist-episode-report: {exc}", file=sys.stderr)
            status = 1
            continue
        print(json.dumps(asdict(r)) if a.json else format_report(r))
    return status


if __name__ == "__main__":
    raise SystemExit(main())
