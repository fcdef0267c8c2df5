"""Recorded episodes and adaptation runs in the view: the same layout and timelines as live.

`log_bags(rec, path)` logs every episode bag of a run directory (or one bag directory) with
`core.ViewerLogger`, oldest first, on the bags' header stamps (the ROS clock of the run); the
messages are decoded from the recorded CDR bytes by rclpy's own deserialiser, as the adapter
reads bags;
`log_adaptation(rec, results.json)` logs an adaptation experiment's rounds (success rate per
real episodes collected, held-out latent loss of the deployed model and of the candidate, the
gate's decision per round; `simdist_adapter.experiment` writes the file).
"""

from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass, field

import rerun as rr
from rclpy.serialization import deserialize_message

from robot_drivers import registry, ros_msgs
from simdist_adapter.bags import EpisodeBag, list_episode_bags
from simdist_viewer import layout as L
from simdist_viewer.core import ViewerLogger
from simdist_viewer.robot3d import RobotScene


@dataclass
class BagViewReport:
    """What was logged: bags, the robot, messages read and rows per entity."""

    bags: list[pathlib.Path] = field(default_factory=list)
    robot: str = ""
    messages: int = 0
    counts: dict = field(default_factory=dict)
    rounds: int = 0


def episode_bags(path: str | pathlib.Path) -> list[pathlib.Path]:
    """The bag directory itself, or every episode bag under a run directory (oldest first)."""
    path = pathlib.Path(path)
    if (path / "metadata.yaml").is_file():
        return [path]
    bags = list_episode_bags(path)
    if not bags:
        raise FileNotFoundError(f"{path}: no episode bag (a directory with episode.json) found")
    return bags


def robot_of(bag: EpisodeBag) -> str:
    """The robot the bag names, else its task's (the registry's), else the one robot whose sensor
    topics (`ros_msgs.SENSOR_TOPICS`) it holds; ValueError when that is not one robot."""
    if bag.meta.robot:
        return bag.meta.robot
    if bag.meta.task in registry.TASKS:
        return registry.robot_of(bag.meta.task)
    held = [r for r, topics in ros_msgs.SENSOR_TOPICS.items() if set(topics) & set(bag.topics)]
    if len(held) != 1:
        raise ValueError(
            f"{bag.path}: names no robot and no registered task, and holds the sensor topics of "
            f"{held or 'no robot'}; record it with the robot in its episode metadata"
        )
    return held[0]


def log_bags(
    rec: rr.RecordingStream,
    path: str | pathlib.Path,
    *,
    robot_3d: bool = True,
    image_every_n: int = 1,
    logger: ViewerLogger | None = None,
) -> BagViewReport:
    """Every episode bag under `path` into `rec`; returns what was logged."""
    report = BagViewReport(bags=episode_bags(path))
    for bag_dir in report.bags:
        with EpisodeBag(bag_dir) as bag:
            if logger is None:
                robot = robot_of(bag)
                cameras = [t.split("/")[2] for t in bag.topics if t.startswith("/camera/")] or None
                scene = RobotScene(robot) if robot_3d else None
                logger = ViewerLogger(rec, robot, cameras, scene=scene, image_every_n=image_every_n)
            report.robot = logger.robot
            topics = [t for t in logger.topics if t in bag.topics]
            for m in bag.raw_messages(topics):
                logger.log(
                    m.topic,
                    deserialize_message(m.data, ros_msgs.message_class(m.msgtype)),
                    m.stamp_ns,
                )
                report.messages += 1
    report.counts = dict(logger.counts) if logger is not None else {}
    return report


def log_adaptation(rec: rr.RecordingStream, results: str | pathlib.Path) -> int:
    """An adaptation experiment's `results.json` into `rec`; returns the rounds logged."""
    data = json.loads(pathlib.Path(results).read_text())
    rounds = 0
    for method, r in data.get("methods", {}).items():
        base = f"{L.ADAPTATION}/{method}"
        rec.log(f"{base}/success_rate", rr.SeriesLines(names=["success rate"]), static=True)
        for point in r.get("curve", []):
            rec.reset_time()
            rec.set_time(L.REAL_EPISODES, sequence=int(point["real_episodes"]))
            rec.log(f"{base}/success_rate", rr.Scalars(float(point["success_rate"])))
        loss = f"{base}/heldout_latent_loss"
        rec.log(loss, rr.SeriesLines(names=["deployed", "candidate"]), static=True)
        for j, rd in enumerate(r.get("rounds", []), start=1):
            rec.reset_time()
            rec.set_time(L.ROUND, sequence=j)
            if rd.get("heldout_candidate") is not None:
                rec.log(
                    loss,
                    rr.Scalars([float(rd["heldout_deployed"]), float(rd["heldout_candidate"])]),
                )
            text = f"round {j}: {'deployed' if rd.get('deployed') else 'refused'}: {rd['reason']}"
            rec.log(f"{base}/rounds", rr.TextLog(text, level="INFO"))
            rounds += 1
    trajectory = data.get("probe_trajectory")
    if trajectory:  # predicted vs real joint trajectory, pretrained and adapted f
        entity = f"{L.ADAPTATION}/probe_trajectory"
        names = ["real", *(f"predicted ({n})" for n in trajectory["predicted"])]
        rec.log(entity, rr.SeriesLines(names=names), static=True)
        series = [trajectory["real"], *trajectory["predicted"].values()]
        for k, values in enumerate(zip(*series)):
            rec.reset_time()
            rec.set_time(L.FUTURE_STEP, sequence=k)
            rec.log(entity, rr.Scalars([float(v) for v in values]))
    rec.reset_time()
    return rounds
