"""D_real: recorded episode bags (and optional demonstrations) -> dataset shards -> (H, T) windows.

A bag holds what the planner saw (`/simdist/observation/*`, the ingestion output) and what the
robot executed (`/simdist/safe_command`, stamped with the observation it answers). One tick is
one row: observation o_k and executed action a_k. Ticks whose command was a safe action (HOLD /
DAMP) or that lack an executed command end a segment, since the dynamics f must only learn
transitions that really were driven by an action. Segments are stored as episodes in the same
HDF5 shard format as the simulation dataset, so the same reader and windows serve both.
Eq. 3 needs no rewards or values: those rows are zero and flagged non-expert.
"""

from __future__ import annotations

import logging
import pathlib
from dataclasses import dataclass, field, replace

import numpy as np
from rclpy.serialization import deserialize_message
from sensor_msgs.msg import Image, JointState
from trajectory_msgs.msg import JointTrajectory

from robot_drivers.interface import CommandKind, Observation, RobotSpec
from robot_drivers.ros_msgs import ObservationAssembler, command_from_msg, stamp_ns
from simdist_adapter.bags import BagError, EpisodeBag, list_episode_bags
from simdist_planner.data.reader import ShardedDataset
from simdist_planner.data.schema import EpisodeRecord, StepLayout, shard_name
from simdist_planner.data.writer import ShardWriter, episode_record
from simdist_planner.planning.observation import ObservationError, observation_arrays

log = logging.getLogger(__name__)

OBS_PREFIX = "/simdist/observation/"
COMMAND_TOPIC = "/simdist/safe_command"


@dataclass
class Segment:
    """Consecutive ticks of one bag driven by real actions: L transitions, L + 1 observations."""

    bag: str
    observations: list[dict[str, np.ndarray]]
    actions: list[np.ndarray]
    success: bool = False
    seed: int = -1


@dataclass
class BuildReport:
    """What `build_real_dataset` did, including every bag it skipped and why."""

    bags_used: list[str] = field(default_factory=list)
    bags_skipped: dict[str, str] = field(default_factory=dict)
    episodes: int = 0
    transitions: int = 0
    demo_episodes: int = 0


def _episode_observations(bag: EpisodeBag, spec: RobotSpec) -> dict[int, Observation]:
    assembler = ObservationAssembler(
        spec.cameras, spec.height_map_shape is not None, spec, max_pending=64
    )
    observations: dict[int, Observation] = {}
    topics = [f"{OBS_PREFIX}proprio"] + [f"{OBS_PREFIX}image/{c}" for c in spec.cameras]
    if spec.height_map_shape is not None:
        topics.append(f"{OBS_PREFIX}height_map")
    missing = [t for t in topics if t not in bag.topics]
    if missing:
        raise BagError(f"{bag.path}: observation topics {missing} were not recorded")
    for m in bag.raw_messages(topics):
        if m.topic.endswith("/proprio"):
            msg = deserialize_message(m.data, JointState)
            obs = assembler.add_proprio(msg)
        elif m.topic.endswith("/height_map"):
            msg = deserialize_message(m.data, Image)
            obs = assembler.add_height_map(msg)
        else:
            msg = deserialize_message(m.data, Image)
            obs = assembler.add_image(m.topic.rsplit("/", 1)[1], msg)
        if obs is not None:
            observations[stamp_ns(msg.header.stamp)] = obs
    return observations


def segments_from_bag(
    path: str | pathlib.Path, spec: RobotSpec, min_transitions: int = 1
) -> list[Segment]:
    """Split one episode bag into action-driven segments. Raises BagError for unreadable bags."""
    with EpisodeBag(path) as bag:
        meta = bag.meta
        observations = _episode_observations(bag, spec)
        commands = {}
        if COMMAND_TOPIC not in bag.topics:
            raise BagError(f"{path}: no {COMMAND_TOPIC} recorded, so no executed actions")
        for m in bag.raw_messages([COMMAND_TOPIC]):
            msg = deserialize_message(m.data, JointTrajectory)
            commands[stamp_ns(msg.header.stamp)] = command_from_msg(msg, spec)
    if not observations:
        raise BagError(
            f"{path}: no complete observation on {OBS_PREFIX}* (was ingestion recorded?)"
        )
    segments: list[Segment] = []
    current: Segment | None = None
    for stamp in sorted(observations):
        try:
            arrays = observation_arrays(observations[stamp], spec)
        except ObservationError as exc:
            log.warning("%s: observation at %d ns unusable (%s); segment ends", path, stamp, exc)
            arrays = None
        cmd = commands.get(stamp)
        if current is not None and arrays is not None:
            current.observations.append(arrays)  # closes the previous transition
        if (  # a driven step
            arrays is not None
            and cmd is not None
            and cmd.kind in (CommandKind.EE_DELTA, CommandKind.JOINT_POSITION)
        ):
            if current is None:
                current = Segment(str(path), [arrays], [], bool(meta.success), int(meta.seed or -1))
            current.actions.append(np.asarray(cmd.values, np.float32))
        elif current is not None:
            segments.append(current)
            current = None
    if current is not None:
        segments.append(current)
    for seg in segments:  # a segment cut by an unusable observation lacks its last o_{k+1}
        seg.actions = seg.actions[: len(seg.observations) - 1]
    return [s for s in segments if len(s.actions) >= min_transitions]


def build_real_dataset(
    bags, out_dir: str | pathlib.Path, spec: RobotSpec, demos=None, min_transitions: int = 1
) -> BuildReport:
    """Write D_real (one shard) from episode bags (paths or directories) plus optional demos.

    A corrupt, truncated or empty bag is skipped with a warning naming it and the reason; all
    other bags still make it in. `demos` are simulation-format shards/directories (off-policy
    data of any quality) whose episodes are copied in as further real episodes.
    """
    layout = StepLayout.from_spec(spec)
    paths: list[pathlib.Path] = []
    for b in [bags] if isinstance(bags, (str, pathlib.Path)) else bags:
        p = pathlib.Path(b)
        paths.extend(
            list_episode_bags(p) if p.is_dir() and not (p / "metadata.yaml").exists() else [p]
        )
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    shard = out / shard_name(0)
    shard.unlink(missing_ok=True)
    report = BuildReport()
    with ShardWriter(
        shard, layout, {"task": "real", "config": "{}", "source": "episode bags"}
    ) as writer:
        next_id = 0
        for p in paths:
            try:
                segments = segments_from_bag(p, spec, min_transitions)
            except (BagError, OSError, ValueError) as exc:
                log.warning("skipping bag %s: %s", p, exc)
                report.bags_skipped[str(p)] = str(exc)
                continue
            if not segments:
                report.bags_skipped[str(p)] = "no action-driven transitions"
                continue
            report.bags_used.append(str(p))
            for seg in segments:
                writer.append(
                    episode_record(
                        seg.observations,
                        seg.actions,
                        next_id,
                        layout,
                        seg.seed,
                        seg.success,
                        seg.bag,
                    )
                )
                next_id += 1
                report.episodes += 1
                report.transitions += len(seg.actions)
        for demo in demos or ():
            source = ShardedDataset(demo)
            # simulation demos may carry the privileged task state; a robot has none to record
            if replace(source.layout, state_terms=()) != layout:
                raise ValueError(
                    f"demonstrations {demo}: layout {source.layout} != robot layout {layout}"
                )
            for i in range(source.num_episodes):
                ep = source.episode(i)
                steps = {k: v for k, v in ep.items() if k not in ("episode", "t", "state")}
                info = source.episode_info(i)
                writer.append(
                    EpisodeRecord(
                        id=next_id,
                        steps=steps,
                        policy=int(info["policy"]),
                        seed=int(info["seed"]),
                        noise_scale=np.asarray(info["noise_scale"], np.float32),
                        never_noised=bool(info["never_noised"]),
                        success=bool(info["success"]),
                        terminated=bool(info["terminated"]),
                        truncated=bool(info["truncated"]),
                        meta={"source": str(demo)},
                    )
                )
                next_id += 1
                report.demo_episodes += 1
                report.transitions += int(info["length"]) - 1
    if report.episodes + report.demo_episodes == 0:
        shard.unlink(missing_ok=True)
        raise ValueError(f"no usable episode in {len(paths)} bag(s): {report.bags_skipped}")
    return report
