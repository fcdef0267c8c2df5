"""The one description of every SimDist graph.

Its nodes, executables, parameter files, remappings and arguments: pure data plus one resolver.
Both launch paths read it: the launch_ros files in `launch/` turn `resolve()`'s nodes into
`launch_ros.actions.Node`s, and the pip launcher (`simdist launch`) turns them into `--ros-args`
command lines. Nothing here imports rclpy, launch or launch_ros; a graph's robot is the task
registry's.
"""

from __future__ import annotations

import os
import pathlib
from dataclasses import dataclass, field, replace

import yaml

from robot_drivers import registry

# Values a launch argument of kind "bool" accepts (as ROS launch does, case-insensitively).
_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")
BOOL = ("true", "false")


@dataclass(frozen=True)
class LaunchArg:
    """A `name:=value` argument, with its default, its allowed values and what it is for."""

    name: str
    default: str
    description: str
    choices: tuple[str, ...] = ()  # allowed values; ("true", "false") marks a boolean
    kind: type = str  # the type of the node parameters it sets (BOOL choices: bool)

    def typed(self, value: str):
        """`value` (validated by resolve_args) as the parameter type it sets."""
        if self.choices == BOOL:
            return value == "true"
        return self.kind(value)


@dataclass(frozen=True)
class NodeSpec:
    """One node of a graph. `when` names arguments that must hold for the node to start."""

    name: str  # node name (also the section of config/<graph>.yaml)
    executable: str  # console script declared in setup.py
    when: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (argument, allowed values): all must hold
    # parameter <- launch argument; the value is typed by the argument (LaunchArg.kind)
    arg_params: tuple[tuple[str, str], ...] = ()
    remappings: tuple[tuple[str, str], ...] = ()
    # restarted after RESPAWN_DELAY_S when it exits while the graph runs (launch_ros `respawn`):
    # a node off the control path whose death must not stop control (the recorder)
    respawn: bool = False


RESPAWN_DELAY_S = 1.0


@dataclass(frozen=True)
class GraphSpec:
    """A task graph: which config file and which MuJoCo task per variant; its robot (the
    registry's robot of its tasks) picks the node set."""

    name: str
    config: str  # file name under config/
    # variant -> MuJoCo task name (robot:=sim); the variants the graph accepts, the first is the
    # default unless "real" is among them
    sim_tasks: tuple[tuple[str, str], ...]

    @property
    def robot(self) -> str:
        return registry.robot_of(self.sim_tasks[0][1])

    @property
    def nodes(self) -> tuple[NodeSpec, ...]:
        return _nodes(self.robot)


@dataclass(frozen=True)
class ResolvedNode:
    """A node ready to start: what both launch paths hand to ROS."""

    name: str
    executable: str
    params_file: pathlib.Path
    overrides: dict = field(default_factory=dict)  # parameter -> typed value (after the file)
    remappings: tuple[tuple[str, str], ...] = ()
    respawn: bool = False  # NodeSpec.respawn
    enclave: str = ""  # SROS2 enclave (keystore:=DIR), e.g. /simdist/planner


@dataclass(frozen=True)
class ResolvedGraph:
    graph: str
    args: dict[str, str]
    env: dict[str, str]  # ROS_DOMAIN_ID, ROS_AUTOMATIC_DISCOVERY_RANGE, for every node
    nodes: tuple[ResolvedNode, ...]


# Latched std_msgs/Bool: the recorder hears the whole loop. Set on the driver here, published by
# the recorder (which imports it), so the name is written once.
RECORDER_READY_TOPIC = "/simdist/recorder/ready"
SUPERVISOR_TOPICS = ("/simdist/safe_command",)  # published by the safety supervisor alone
# keystore:=DIR runs node <name> in the SROS2 enclave ENCLAVE_ROOT/<name>.
ENCLAVE_ROOT = "/simdist"

COMMON_ARGS: tuple[LaunchArg, ...] = (
    LaunchArg(
        "robot",
        "sim",
        "sim: the MuJoCo robot; real: the hardware driver; replay: a recorded bag (open-loop)",
        ("sim", "real", "replay"),
    ),
    LaunchArg("bag", "", "robot:=replay: the episode bag directory to replay"),
    LaunchArg(
        "variant",
        "real",
        "MuJoCo world when robot:=sim: sim (training world) or real (the real-world stand-in)",
        ("sim", "real"),
    ),
    LaunchArg("checkpoint", "", "world-model checkpoint directory the planner loads (required)"),
    LaunchArg("device", "cpu", "torch device of the planner: cpu, cuda or cuda:N"),
    LaunchArg("record", "false", "record every topic of each episode to an MCAP bag", BOOL),
    LaunchArg("bag_dir", "bags", "directory the recorder writes episode bags into"),
    LaunchArg("video", "false", "run the SimForcing video-prediction preview node", BOOL),
    LaunchArg("video_checkpoint", "", "video:=true: the SimForcing student checkpoint directory"),
    LaunchArg("adapt", "false", "run the adapter node (fine-tunes f on recorded episodes)", BOOL),
    LaunchArg(
        "view",
        "false",
        "run the Rerun viewer node: the robot, cameras, plan, values and safety state, live "
        "(docs/viewer.md; its mode and ports are node parameters)",
        BOOL,
    ),
    LaunchArg(
        "lockstep",
        "true",
        "robot:=sim only: the simulator advances one control period per command, on /clock",
        BOOL,
    ),
    LaunchArg("seed", "0", "seed of the first MuJoCo episode (robot:=sim)", kind=int),
    LaunchArg(
        "episodes", "0", "robot:=sim: number of episodes to run, 0 = until stopped", kind=int
    ),
    LaunchArg("domain", "", "ROS_DOMAIN_ID for every node (empty: inherit the environment)"),
    LaunchArg(
        "discovery",
        "",
        "DDS discovery range of every node (ROS_AUTOMATIC_DISCOVERY_RANGE): localhost or "
        "subnet; empty: localhost for robot:=sim and robot:=replay (no other machine can join "
        "or command them), the environment's for robot:=real",
        ("", "localhost", "subnet"),
    ),
    LaunchArg(
        "params_file", "", "parameter file used instead of config/<graph>.yaml (same sections)"
    ),
    LaunchArg(
        "keystore",
        "",
        "SROS2 keystore directory: every node runs in its enclave /simdist/<node> with "
        "DDS-Security enforced (authenticated, encrypted, access-controlled); needs a ROS install "
        "whose DDS has the security plugins (docs/safety.md). Empty: no DDS-Security",
    ),
)


def _option_args(robot: str) -> tuple[LaunchArg, ...]:
    """The launch arguments of a robot's task options that its graphs take (`launch` in the
    option's description, robot_drivers.tasks.options), each named by its flag; "0" or "" leaves
    the option to the task."""
    return tuple(
        LaunchArg(
            o.flag,
            str(o.unset_value),
            f"robot:=sim: {o.doc} ({o.unset_value!r}: {o.unset})",
            o.choices,
            kind=o.kind,
        )
        for o in registry.robot_options(robot).described()
        if o.launch
    )


def _option_params(robot: str) -> tuple[tuple[str, str], ...]:
    """The MuJoCo driver's task option parameters set from launch arguments (parameter <-
    argument)."""
    return tuple((o.name, o.flag) for o in registry.robot_options(robot).described() if o.launch)


UR5E_ARGS = (
    LaunchArg("robot_ip", "", "UR5e controller IP address (robot:=real)"),
    *_option_args("ur5e"),
)
GO2_ARGS = (
    LaunchArg("network_interface", "", "network interface wired to the Go2 (robot:=real)"),
    *_option_args("go2"),
)


_REAL = (("robot", ("real",)),)


@dataclass(frozen=True)
class RobotLaunch:
    """What a robot adds to its graphs: the hardware driver node (robot:=real), the launch
    arguments it takes, and the MuJoCo driver's task options set from arguments
    (parameter <- argument; both from the robot's task options, `_option_args`)."""

    hardware_driver: NodeSpec
    args: tuple[LaunchArg, ...]
    course: tuple[tuple[str, str], ...] = ()


ROBOT_LAUNCH = {
    "ur5e": RobotLaunch(
        NodeSpec(
            "ur5e_driver",
            "ur5e_rtde_driver_node",
            when=_REAL,
            arg_params=(("robot_ip", "robot_ip"),),
        ),
        UR5E_ARGS,
        course=_option_params("ur5e"),
    ),
    "go2": RobotLaunch(
        NodeSpec(
            "go2_driver",
            "go2_sdk_driver_node",
            when=_REAL,
            arg_params=(("network_interface", "network_interface"),),
        ),
        GO2_ARGS,
        course=_option_params("go2"),
    ),
}


def _nodes(robot: str) -> tuple[NodeSpec, ...]:
    """The node set every graph of a robot runs; its hardware driver from ROBOT_LAUNCH."""
    hw_driver, course = ROBOT_LAUNCH[robot].hardware_driver, ROBOT_LAUNCH[robot].course
    return (
        NodeSpec(
            "mujoco_driver",
            "mujoco_driver_node",
            when=(("robot", ("sim",)),),
            arg_params=(
                ("variant", "variant"),
                ("lockstep", "lockstep"),
                ("seed", "seed"),
                ("episodes", "episodes"),
                *course,
            ),
        ),
        hw_driver,
        NodeSpec(
            "replay", "replay_node", when=(("robot", ("replay",)),), arg_params=(("bag", "bag"),)
        ),
        NodeSpec("ingestion", "ingestion_node"),
        NodeSpec("safety_supervisor", "safety_supervisor_node", when=(("robot", ("sim", "real")),)),
        NodeSpec(
            "planner",
            "planner_node",
            arg_params=(("checkpoint", "checkpoint"), ("device", "device")),
        ),
        NodeSpec(
            "recorder",
            "recorder_node",
            when=(("record", ("true",)),),
            arg_params=(("bag_dir", "bag_dir"), ("checkpoint", "checkpoint")),
            respawn=True,
        ),
        NodeSpec(
            "video_prediction",
            "video_prediction_node",
            when=(("video", ("true",)),),
            arg_params=(("checkpoint", "video_checkpoint"), ("device", "device")),
        ),
        NodeSpec(
            "adapter",
            "adapter_node",
            when=(("adapt", ("true",)),),
            arg_params=(("checkpoint", "checkpoint"), ("bag_dir", "bag_dir"), ("device", "device")),
        ),
        NodeSpec("viewer", "viewer_node", when=(("view", ("true",)),)),
    )


GRAPHS: dict[str, GraphSpec] = {
    "peg": GraphSpec("peg", "peg.yaml", (("sim", "peg"), ("real", "peg"))),
    "table_leg": GraphSpec(
        "table_leg", "table_leg.yaml", (("sim", "table_leg"), ("real", "table_leg"))
    ),
    "go2_flat": GraphSpec("go2_flat", "go2_flat.yaml", (("sim", "go2_flat"),)),
    "go2_slope": GraphSpec(
        "go2_slope", "go2_slope.yaml", (("sim", "go2_slope"), ("real", "slippery_slope"))
    ),
    "go2_foam": GraphSpec("go2_foam", "go2_foam.yaml", (("sim", "go2_flat"), ("real", "foam"))),
}


def graph_args(graph: str) -> tuple[LaunchArg, ...]:
    """Every argument a graph accepts (what `ros2 launch ... --show-args` lists)."""
    spec = _graph(graph)
    variants = tuple(v for v, _ in spec.sim_tasks)
    common = tuple(
        replace(a, choices=variants, default=a.default if a.default in variants else variants[0])
        if a.name == "variant"
        else a
        for a in COMMON_ARGS
    )
    return common + ROBOT_LAUNCH[spec.robot].args


def config_dir() -> pathlib.Path:
    """config/ of the source tree, else the installed package share (colcon install)."""
    source = pathlib.Path(__file__).resolve().parents[3] / "config"
    if source.is_dir():
        return source
    from ament_index_python.packages import get_package_share_directory  # noqa: PLC0415 - exists only on a real ROS 2 install

    return pathlib.Path(get_package_share_directory("simdist_planner")) / "config"


def config_path(graph: str) -> pathlib.Path:
    path = config_dir() / _graph(graph).config
    if not path.is_file():
        raise FileNotFoundError(f"parameter file for graph {graph!r} not found: {path}")
    return path


def _graph(graph: str) -> GraphSpec:
    if graph not in GRAPHS:
        raise ValueError(f"unknown graph {graph!r}; known graphs: {sorted(GRAPHS)}")
    return GRAPHS[graph]


def _as_bool(name: str, value: str) -> str:
    low = value.strip().lower()
    if low in _TRUE:
        return "true"
    if low in _FALSE:
        return "false"
    raise ValueError(f"argument {name}:={value!r} must be true or false")


def resolve_args(graph: str, given: dict[str, str]) -> dict[str, str]:
    """Defaults + given arguments, validated: unknown names and bad choices are errors."""
    declared = {a.name: a for a in graph_args(graph)}
    unknown = sorted(set(given) - set(declared))
    if unknown:
        raise ValueError(
            f"unknown argument(s) {unknown} for graph {graph!r}; known: {sorted(declared)}"
        )
    args = {name: str(given.get(name, a.default)) for name, a in declared.items()}
    for name, a in declared.items():
        if a.choices == BOOL:
            args[name] = _as_bool(name, args[name])
        elif a.choices and args[name] not in a.choices:
            raise ValueError(f"argument {name}:={args[name]!r} must be one of {list(a.choices)}")
    for name in ("seed", "episodes"):
        if not args[name].lstrip("-").isdigit() or int(args[name]) < 0:
            raise ValueError(f"argument {name}:={args[name]!r} must be a non-negative integer")
    _check_option_args(graph, args)
    if args["domain"] and not (args["domain"].isdigit() and 0 <= int(args["domain"]) <= 232):
        raise ValueError(
            f"argument domain:={args['domain']!r} must be an integer ROS domain id 0..232"
        )
    if not args["checkpoint"]:
        raise ValueError(
            "argument checkpoint:=<dir> is required: the planner needs a world-model checkpoint"
        )
    for name in (
        "checkpoint",
        "bag",
        "bag_dir",
        "video_checkpoint",
        "params_file",
        "keystore",
    ):  # nodes may run elsewhere than the caller's cwd
        if args[name]:
            args[name] = os.path.abspath(os.path.expanduser(args[name]))
    if args["robot"] == "replay" and not args["bag"]:
        raise ValueError("robot:=replay needs bag:=<episode bag directory>")
    if args["robot"] == "real":
        for hw_arg in ("robot_ip", "network_interface"):
            if hw_arg in args and not args[hw_arg]:
                raise ValueError(f"robot:=real needs {hw_arg}:=<value> for graph {graph!r}")
    return args


def _check_option_args(graph: str, args: dict[str, str]) -> None:
    """The task option arguments, checked by the options' one validator
    (robot_drivers.tasks.options) for the task the graph's variant runs."""
    spec = _graph(graph)
    task = dict(spec.sim_tasks).get(args["variant"])
    if task is None:
        return
    options = registry.entry(task).options
    for param, arg in ROBOT_LAUNCH[spec.robot].course:
        o = next(q for q in options.described() if q.name == param)
        try:
            value = o.kind(args[arg])
        except ValueError:
            raise ValueError(
                f"argument {arg}:={args[arg]!r} must be a {o.kind.__name__} "
                f"({o.unset_value!r}: {o.unset})"
            ) from None
        try:
            options.of(task, args["variant"], unset_values=True, **{param: value})
        except ValueError as e:
            raise ValueError(f"argument {arg}:={args[arg]}: {e}") from None


def resolve(graph: str, given: dict[str, str] | None = None) -> ResolvedGraph:
    """The nodes to start for `graph` with these arguments, with their parameters and remappings."""

    spec = _graph(graph)
    args = resolve_args(graph, dict(given or {}))
    params_file = pathlib.Path(args["params_file"]) if args["params_file"] else config_path(graph)
    if not params_file.is_file():
        raise ValueError(f"argument params_file:={params_file} is not a file")
    changes = yaml.safe_load(params_file.read_text()) or {}
    # lockstep MuJoCo and replay run every node on /clock; hardware runs on the wall clock
    sim_time = args["robot"] == "replay" or (args["robot"] == "sim" and args["lockstep"] == "true")
    task = dict(spec.sim_tasks)[args["variant"]]
    declared = {a.name: a for a in graph_args(graph)}
    nodes = []
    for node in spec.nodes:
        if any(args[a] not in allowed for a, allowed in node.when):
            continue
        if not isinstance(changes.get(node.name, {}), dict):
            raise ValueError(f"{params_file}: section {node.name!r} is not a mapping")
        # replay is the clock's source and paces itself on the wall clock
        overrides: dict = {"use_sim_time": sim_time and node.name != "replay"}
        for param, arg in node.arg_params:
            overrides[param] = declared[arg].typed(args[arg])
        if node.name == "planner":
            overrides["lockstep"] = sim_time  # plan once per observation when the simulator waits
        if node.name == "mujoco_driver":
            overrides["task"] = task
            if (
                args["record"] == "true" and sim_time
            ):  # lockstep: the first tick waits until every tick is recorded
                overrides["wait_for_ready"] = RECORDER_READY_TOPIC
        if node.name == "replay" and args["record"] == "true":
            overrides["wait_for_ready"] = RECORDER_READY_TOPIC  # the first tick is recorded too
        if node.name == "viewer":
            overrides["graph"] = graph  # its layout
        if node.name == "recorder":
            overrides["task"] = task if args["robot"] == "sim" else graph
            # only simulation announces episodes (/simdist/episode); hardware records a bag per run
            overrides["split_episodes"] = args["robot"] != "real"
            if args["robot"] == "replay":  # no supervisor: its topics would never be matched
                section = changes.get("recorder", {}).get("ros__parameters", {})
                ready = section.get("ready_topics")
                if ready:
                    overrides["ready_topics"] = [t for t in ready if t not in SUPERVISOR_TOPICS]
        nodes.append(
            ResolvedNode(
                node.name,
                node.executable,
                params_file,
                overrides,
                node.remappings,
                node.respawn,
                f"{ENCLAVE_ROOT}/{node.name}" if args["keystore"] else "",
            )
        )
    env = {"ROS_DOMAIN_ID": args["domain"]} if args["domain"] else {}
    discovery = args["discovery"] or ("localhost" if args["robot"] != "real" else "")
    if discovery:
        env["ROS_AUTOMATIC_DISCOVERY_RANGE"] = discovery.upper()
    if args["keystore"]:
        env.update(_security_env(args["keystore"], nodes))
    return ResolvedGraph(graph, args, env, tuple(nodes))


def _security_env(keystore: str, nodes: list[ResolvedNode]) -> dict[str, str]:
    """SROS2: every node's enclave must be in the keystore; security is enforced, not permissive
    (a node without valid credentials does not start, rather than run unprotected)."""
    root = pathlib.Path(keystore)
    if not (root / "enclaves").is_dir():
        raise ValueError(
            f"argument keystore:={keystore} is not an SROS2 keystore (no enclaves/); create one "
            f"with: ros2 security create_keystore {keystore}"
        )
    missing = [n.enclave for n in nodes if not (root / "enclaves" / n.enclave.lstrip("/")).is_dir()]
    if missing:
        raise ValueError(
            f"keystore {keystore} has no enclave(s) {missing}; create each with: "
            f"ros2 security create_enclave {keystore} <enclave>"
        )
    return {
        "ROS_SECURITY_KEYSTORE": keystore,
        "ROS_SECURITY_ENABLE": "true",
        "ROS_SECURITY_STRATEGY": "Enforce",
    }


def ros_args(node: ResolvedNode) -> list[str]:
    """The `--ros-args` tail that starts `node` exactly as launch_ros would."""
    out = ["--ros-args", "-r", f"__node:={node.name}", "--params-file", str(node.params_file)]
    for key, value in node.overrides.items():
        out += ["-p", f"{key}:={_yaml_scalar(value)}"]
    for src, dst in node.remappings:
        out += ["-r", f"{src}:={dst}"]
    if node.enclave:
        out += ["--enclave", node.enclave]
    return out


def _yaml_scalar(value) -> str:
    """Render a parameter as the YAML scalar rcl parses back to the same type."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        # quote strings that YAML would read as another type (numbers, booleans, empty)

        if value == "" or not isinstance(yaml.safe_load(value), str):
            return "'" + value.replace("'", "''") + "'"
        return value
    return repr(value)


def launch_env(graph: ResolvedGraph) -> dict[str, str]:
    """The environment nodes run in: the caller's plus the graph's (ROS_DOMAIN_ID)."""
    env = dict(os.environ)
    env.update(graph.env)
    return env
