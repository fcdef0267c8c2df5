"""Entity paths of the view and the saved layout (Rerun blueprint) of every graph.

One module names every entity, so the logging core and the blueprint agree. A graph's layout
depends only on its robot's `RobotSpec` (`robot_drivers.specs`): a robot with a height map gets
the world, both height maps and its joints (the `go2_*` graphs); one without gets its cameras
beside the world (`peg` and `table_leg`: the UR5e's three cameras). Plans of joint-target robots
are shown as joint targets (rad).
"""

from __future__ import annotations

import rerun.blueprint as rrb

from robot_drivers.interface import CommandKind, RobotSpec
from robot_drivers.specs import robot_spec
from simdist_planner.ros.launch_description import GRAPHS

APPLICATION_ID = "simdist"

# timelines
ROS_TIME = "ros_time"  # header stamps (sim time in lockstep, wall time on hardware)
TICK = "tick"  # control ticks since the first stamp the view saw
REAL_EPISODES = "real_episodes"  # adaptation results: episodes collected so far
ROUND = "round"  # adaptation results: round number
FUTURE_STEP = "future_step"  # adaptation results: steps into a predicted window

# entities
WORLD = "world"
ROBOT_3D = "world/robot"  # one child per MuJoCo body, its pose on the ROS clock
TCP = "world/tcp"  # UR5e tool centre point
TCP_PATH = "world/plan/tcp_path"  # UR5e: the TCP path the planned chunk implies
HEIGHT_MAP_3D = "world/height_map"  # Go2: the height scan as points in the world
JOINT_POSITION = "joints/position"
JOINT_VELOCITY = "joints/velocity"
PLAN_FIRST = "plan/first"  # the action the plan starts with (Go2: joint targets, rad)
PLAN_CHUNK = "plan/chunk"  # the whole chunk, one line per action element over the horizon
COMMAND = "plan/executed"  # the safety supervisor's command (what the robot then did)
VALUES_PREDICTED = "values/predicted"  # r^_t and v^_{t+1} of the plan
VALUES_REALISED = "values/realised"  # the reward the episode reported for the tick
VALUES_ALONG_PLAN = "values/along_plan"  # r^ and v^ over the horizon
SAFETY_STATE = "safety/state"  # OK / HOLD / DAMP
SAFETY_REASON = "safety/reason"  # the supervisor's diagnostic message when it changes
PLANNER_LATENCY = "planner/latency_ms"
PLANNER_COUNTS = "planner/counts"  # fallbacks, deadline misses, failed plans
DIAGNOSTICS = "diagnostics"  # diagnostics/<node>: level and message changes
EPISODE_EVENTS = "episode/events"
ADAPTATION = "adaptation"


def camera_entity(camera: str, kind: str) -> str:
    """kind: raw (as ingested), model (as the model sees it), predicted (SimForcing)."""
    return f"cameras/{camera}/{kind}"


def height_map_entity(kind: str) -> str:
    """kind: raw (the driver's) or model (ingestion's)."""
    return f"height_map/{kind}"


def graph_robot(graph: str) -> str:
    if graph not in GRAPHS:
        raise ValueError(f"unknown graph {graph!r}; expected one of {sorted(GRAPHS)}")
    return GRAPHS[graph].robot


def control_period_s(spec: RobotSpec) -> float:
    """One control tick of the robot's graphs (s)."""
    return 1.0 / spec.control_rate_hz


def _common_plots(spec: RobotSpec) -> list:
    joint_targets = spec.command_kind == CommandKind.JOINT_POSITION
    plan_name = "joint targets (rad)" if joint_targets else "planned action"
    return [
        rrb.TimeSeriesView(
            origin="values",
            contents=[f"{VALUES_PREDICTED}/**", f"{VALUES_REALISED}/**"],
            name="predicted reward, value vs realised reward",
        ),
        rrb.TimeSeriesView(
            origin="plan",
            contents=[f"{PLAN_FIRST}/**", f"{COMMAND}/**"],
            name=f"{plan_name}: planned vs executed",
        ),
        rrb.Spatial2DView(origin=PLAN_CHUNK, name="planned chunk over the horizon"),
        rrb.Spatial2DView(origin=VALUES_ALONG_PLAN, name="r^, v^ along the plan"),
    ]


def _status_row() -> rrb.Horizontal:
    return rrb.Horizontal(
        rrb.StateTimelineView(origin="safety", contents=[SAFETY_STATE], name="safety state"),
        rrb.TimeSeriesView(origin="planner", name="planner latency (ms), fallbacks"),
        rrb.TextLogView(
            origin="/", contents=[f"{DIAGNOSTICS}/**", SAFETY_REASON, EPISODE_EVENTS], name="log"
        ),
    )


def adaptation_view() -> rrb.Horizontal:
    return rrb.Horizontal(
        rrb.TimeSeriesView(origin=ADAPTATION, name="adaptation: success, held-out latent loss"),
        rrb.TextLogView(origin=ADAPTATION, name="adaptation rounds"),
    )


def blueprint(graph: str, cameras=None, adaptation: bool = False) -> rrb.Blueprint:
    """The arranged view of one graph (`cameras`: the cameras shown, default all of its robot's)."""
    spec = robot_spec(graph_robot(graph))
    cameras = spec.cameras if cameras is None else tuple(cameras)
    world = rrb.Spatial3DView(origin=WORLD, name="robot")
    plots = _common_plots(spec)
    if spec.height_map_shape is None:
        camera_views = [
            rrb.Spatial2DView(origin=camera_entity(cam, kind), name=f"{cam}: {label}")
            for cam in cameras
            for kind, label in (("raw", "camera"), ("model", "model input"), ("predicted", "pred"))
        ]
        top = rrb.Horizontal(
            rrb.Grid(*camera_views, grid_columns=3) if camera_views else rrb.TextLogView(),
            world,
            column_shares=[3, 2],
        )
    else:
        top = rrb.Horizontal(
            world,
            rrb.Vertical(
                rrb.TensorView(origin=height_map_entity("raw"), name="height map (driver)"),
                rrb.TensorView(origin=height_map_entity("model"), name="height map (model)"),
            ),
            rrb.TimeSeriesView(origin="joints", name="joint positions, velocities"),
            column_shares=[2, 1, 2],
        )
    live = rrb.Vertical(
        top,
        rrb.Grid(*plots, grid_columns=4),
        _status_row(),
        row_shares=[3, 2, 1],
        name="live",
    )
    parts = rrb.Tabs(live, adaptation_view()) if adaptation else live
    return rrb.Blueprint(parts, collapse_panels=True)
