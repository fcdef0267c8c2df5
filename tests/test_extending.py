"""docs/extending.md stays true: every task's registry entry is complete, every robot has what
the stack looks up per robot, robot-name branches live only in robot-specific modules (a new
robot's RobotSpec carries it through the safety supervisor and the viewer), and every file the
guide names exists."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import pathlib
import re

import numpy as np
import pytest
import rerun as rr

from robot_drivers import registry
from robot_drivers.go2.scene import SlopePanel, TerrainConfig
from robot_drivers.interface import Command, CommandKind
from robot_drivers.safety import SafetyConfig, SafetySupervisor
from robot_drivers.specs import ROBOT_SPECS, robot_spec
from robot_drivers.tasks import go2_tasks
from robot_drivers.tasks.go2_tasks import Go2Course
from robot_drivers.tasks.options import Go2Options, TaskOptions
from simdist_planner.evaluation.datagen import ROBOT_DATA_CONFIGS
from simdist_planner.evaluation.evaluate import AgentSummary
from simdist_planner.planning.config import PLANNER_CONFIGS
from simdist_planner.ros.launch_description import GRAPHS, ROBOT_LAUNCH, _nodes
from simdist_planner.training.config import PRETRAIN_PRESETS
from simdist_viewer.core import ViewerLogger

ROOT = pathlib.Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "extending.md"
HEADLINES = {f.name for f in dataclasses.fields(AgentSummary)}


def entry_problems(name: str, entry: registry.TaskEntry) -> list[str]:
    """What the guide's task checklist finds missing in one registry entry ([] = complete)."""
    problems = []
    if entry.robot not in ROBOT_SPECS:
        problems.append(f"robot {entry.robot!r} has no spec (robot_drivers/specs.py)")
    module_name, _, factory = entry.factory.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        return [*problems, f"factory module {module_name!r} does not import: {exc}"]
    if not callable(getattr(module, factory, None)):
        problems.append(f"factory {entry.factory!r} is not a function")
    elif "options" not in inspect.signature(getattr(module, factory)).parameters:
        problems.append(f"factory {entry.factory!r} takes no `options` (its TaskOptions)")
    if not (isinstance(entry.options, type) and issubclass(entry.options, TaskOptions)):
        problems.append(f"options {entry.options!r} is not a TaskOptions dataclass")
    experts = importlib.import_module(entry.experts or module_name)
    for fn in ("expert_ladder", "expert_value"):
        if not callable(getattr(experts, fn, None)):
            problems.append(f"experts {experts.__name__} lack {fn}")
    if entry.graph:
        graph = GRAPHS.get(entry.graph)
        if graph is None:
            problems.append(f"graph {entry.graph!r} is not in GRAPHS")
        elif name not in {task for _, task in graph.sim_tasks}:
            problems.append(f"graph {entry.graph!r} does not run {name!r}")
        for path in (f"config/{entry.graph}.yaml", f"launch/{entry.graph}.launch.py"):
            if not (ROOT / path).is_file():
                problems.append(f"{path} is missing")
    if entry.pretrain_preset and entry.pretrain_preset not in PRETRAIN_PRESETS:
        problems.append(f"pretraining preset {entry.pretrain_preset!r} does not exist")
    if entry.headline not in HEADLINES:
        problems.append(f"headline {entry.headline!r} is not an AgentSummary field")
    return problems


@pytest.mark.parametrize("name", sorted(registry.TASKS))
def test_every_task_entry_is_complete(name):
    assert entry_problems(name, registry.TASKS[name]) == []


def test_an_incomplete_entry_is_reported_item_by_item():
    entry = registry.TaskEntry(
        "spot",
        "robot_drivers.tasks.go2_tasks:make_spot_task",
        graph="nowhere",
        pretrain_preset="spot",
        headline="speed",
    )
    problems = "\n".join(entry_problems("spot_walk", entry))
    for expected in (
        "robot 'spot' has no spec",
        "is not a function",
        "graph 'nowhere' is not in GRAPHS",
        "config/nowhere.yaml is missing",
        "pretraining preset 'spot'",
        "headline 'speed'",
    ):
        assert expected in problems
    wrong_graph = dataclasses.replace(registry.TASKS["peg"], graph="go2_flat")
    assert entry_problems("peg", wrong_graph) == ["graph 'go2_flat' does not run 'peg'"]


@pytest.mark.parametrize("robot", sorted({e.robot for e in registry.TASKS.values()}))
def test_every_robot_has_its_per_robot_entries(robot):
    assert robot in ROBOT_SPECS and robot in ROBOT_LAUNCH
    assert robot in PLANNER_CONFIGS and robot in ROBOT_DATA_CONFIGS
    assert any(registry.TASKS[t].graph for t in registry.tasks_of(robot)), "no graph runs it"


@pytest.mark.parametrize("graph", sorted(GRAPHS))
def test_every_graph_runs_registered_tasks_of_one_robot(graph):
    tasks = [task for _, task in GRAPHS[graph].sim_tasks]
    assert all(task in registry.TASKS for task in tasks)
    assert {registry.robot_of(task) for task in tasks} == {GRAPHS[graph].robot}


def test_episode_options_are_checked_by_the_tasks_options():
    assert registry.episode_overrides("peg", max_steps=10, image_size=(32, 32)) == {
        "max_steps": 10,
        "image_size": (32, 32),
    }
    assert registry.episode_overrides("go2_flat", max_steps=10, speed=0.3, region=None) == {
        "max_steps": 10,
        "speed": 0.3,
    }
    with pytest.raises(ValueError, match="speed: not an option of task 'peg'"):
        registry.episode_overrides("peg", speed=0.3)
    with pytest.raises(ValueError, match="region: not an option of task 'foam'"):
        registry.episode_overrides("foam", region="wide")
    with pytest.raises(ValueError, match="unknown task 'nope'"):
        registry.robot_of("nope")


def test_every_path_the_guide_names_exists():
    text = GUIDE.read_text()
    paths = set(
        re.findall(
            r"`((?:src|tests|config|launch|docs)/[^`<>*\s]+|setup\.py|pyproject\.toml)`", text
        )
    )
    assert len(paths) > 20, "the guide names files as `path` in backticks"
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert missing == []


# Where a robot's name may decide what code does: its own package, its node modules (named after
# it), and the task, expert and hardware modules.
ROBOT_MODULE_DIRS = ("experts", "tasks", "hardware")


def robot_specific(path: pathlib.Path, robots) -> bool:
    parts = path.relative_to(ROOT / "src").parts
    if parts[0] != "robot_drivers" or len(parts) < 2:
        return False
    first = parts[1].removesuffix(".py")
    return first in robots or first in ROBOT_MODULE_DIRS or first.split("_")[0] in robots


def robot_name_branches(source: str, robots) -> list[int]:
    """Lines of `source` that branch on a robot's name: a comparison with it (==, !=, in, ...),
    a conditional expression or a match case that picks one. A robot name as a dict key, a
    default or an argument is not a branch."""

    def names_robot(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return isinstance(node.value, str) and node.value in robots
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return any(names_robot(e) for e in node.elts)
        return False

    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(
            names_robot(x) for x in (node.left, *node.comparators)
        ):
            lines.append(node.lineno)
        elif isinstance(node, ast.IfExp) and (names_robot(node.body) or names_robot(node.orelse)):
            lines.append(node.lineno)
        elif isinstance(node, ast.MatchValue) and names_robot(node.value):
            lines.append(node.lineno)
    return sorted(lines)


def test_the_branch_scan_finds_comparisons_and_choices_not_tables():
    robots = {"ur5e", "go2"}
    source = """
if robot == "go2": pass
ok = name in ("ur5e", "go2")
pick = "ur5e" if tcp else "go2"
match robot:
    case "ur5e": pass
TABLE = {"ur5e": 1, "go2": 2}
cfg = make(robot="go2")
plain = name == "peg"
"""
    assert robot_name_branches(source, robots) == [2, 3, 4, 6]
    src = ROOT / "src"
    assert robot_specific(src / "robot_drivers/go2/backend.py", robots)
    assert robot_specific(src / "robot_drivers/tasks/ur5e_tasks.py", robots)
    assert robot_specific(src / "robot_drivers/ur5e_rtde_driver_node.py", robots)
    assert not robot_specific(src / "robot_drivers/safety.py", robots)
    assert not robot_specific(src / "simdist_viewer/core.py", robots)


def test_robot_name_branches_live_only_in_robot_specific_modules():
    robots = set(ROBOT_SPECS)
    found = {}
    for path in sorted((ROOT / "src").rglob("*.py")):
        if not robot_specific(path, robots):
            lines = robot_name_branches(path.read_text(), robots)
            if lines:
                found[str(path.relative_to(ROOT))] = lines
    assert found == {}, "read the robot's RobotSpec (robot_drivers/specs.py) instead"


@pytest.mark.parametrize("like", sorted(ROBOT_SPECS))
def test_a_new_robots_spec_flows_through_safety_and_viewer(monkeypatch, like):
    """A robot that differs from an existing one only by name: registering its RobotSpec is
    all the safety supervisor and the viewer need to treat it the same way."""
    spec = dataclasses.replace(robot_spec(like), name="newbot")
    monkeypatch.setitem(ROBOT_SPECS, "newbot", lambda: spec)
    new, old = SafetyConfig(robot="newbot"), SafetyConfig(robot=like)
    assert (new.action_kind, new.action_dim) == (old.action_kind, old.action_dim)
    for damp in (False, True):
        kinds = {SafetySupervisor(c).safe_command(1.0, damp=damp).kind for c in (new, old)}
        assert len(kinds) == 1
    sup = SafetySupervisor(new)
    sup.observation(1.0)
    sup.tcp_pose([0.1, 0.5, 0.3])
    decision = sup.filter(Command(spec.command_kind, np.zeros(spec.action_dim), 1.0), now=1.0)
    assert decision.status == "pass" and decision.command.kind == spec.command_kind
    assert SafetySupervisor(new).safe_command(1.0, damp=True).kind == (
        CommandKind.DAMP if spec.damping_mode else CommandKind.HOLD
    )
    rec = rr.RecordingStream("simdist_test_extending")
    viewer, reference = ViewerLogger(rec, "newbot"), ViewerLogger(rec, like)
    assert viewer.cameras == reference.cameras and viewer.period_ns == reference.period_ns
    chunk = np.full((3, spec.action_dim), 0.5)
    np.testing.assert_array_equal(viewer._targets(chunk), reference._targets(chunk))
    np.testing.assert_array_equal(
        viewer._chunk_display(chunk)[0], reference._chunk_display(chunk)[0]
    )


def test_a_new_go2_task_by_the_guides_steps_runs_an_episode(monkeypatch):
    """docs/extending.md, "A Go2 task": a course row in GO2_COURSES and a registry entry, and
    nothing else, make a task the stack runs (here a single 4 deg ramp, one short episode with
    the official expert; no graph of its own)."""
    ramp = TerrainConfig(panels=(SlopePanel(1.0, 4.0),), panels_start_x=0.3, plateau_length=2.0)
    monkeypatch.setitem(go2_tasks.GO2_COURSES, "go2_ramp", Go2Course(ramp, success_distance=1.0))
    monkeypatch.setitem(
        registry.TASKS,
        "go2_ramp",
        registry.TaskEntry(
            "go2",
            f"{registry.GO2_TASK_MODULE}:make_go2_task",
            experts="robot_drivers.experts.go2",
            headline="mean_return",
            options=Go2Options,
        ),
    )
    assert entry_problems("go2_ramp", registry.TASKS["go2_ramp"]) == []
    assert "go2_ramp" in registry.tasks_of("go2")
    overrides = registry.episode_overrides("go2_ramp", max_steps=60, speed=0.5)
    task = registry.make_task("go2_ramp", "sim", **overrides)
    try:
        assert task.backend.terrain == ramp and task.max_steps == 60
        expert = registry.expert_ladder(task)[0]
        out = go2_tasks.rollout(task, expert, seed=0)
        assert out.steps == 60 and not out.last.info["fallen"]
        assert out.last.info["distance"] > 0.3  # it walked onto the ramp at ~0.5 m/s
    finally:
        task.close()


def _node_scripts() -> dict[str, str]:
    """setup.py's ROS 2 node executables -> their module."""
    text = (ROOT / "setup.py").read_text().split("# ROS 2 nodes", 1)[1]
    return dict(re.findall(r'"(\w+_node) = ([\w.]+):main"', text))


def test_every_node_has_what_the_guides_node_steps_add():
    """docs/extending.md, "A node": its module, its console script, its place in the
    import-linter layers and a NodeSpec that starts it (tests/test_launch.py checks its section
    in every graph's parameter file)."""
    scripts = _node_scripts()
    assert len(scripts) >= 10
    layers = (ROOT / "pyproject.toml").read_text()
    launched = {spec.executable for robot in ROBOT_LAUNCH for spec in _nodes(robot)}
    for executable, module in scripts.items():
        package, _, name = module.rpartition(".")
        assert (ROOT / "src" / f"{module.replace('.', '/')}.py").is_file(), module
        # in its package's layers by name, or through its sub-package (simdist_planner.ros)
        inner = package.split(".")[-1] if "." in package else name
        assert any(re.search(rf'"[^"\n]*\b{n}\b[^"\n]*"', layers) for n in (name, inner)), (
            f"{module} is in no import-linter layer"
        )
        assert executable in launched, f"no NodeSpec starts {executable}"


def test_every_go2_course_has_its_row_in_the_go2_docs():
    """docs/extending.md, "A Go2 task", step 3: docs/go2_sim.md's task table has a row each."""
    rows = re.findall(r"^\| (\w+) \|", (ROOT / "docs" / "go2_sim.md").read_text(), re.M)
    missing = set(go2_tasks.GO2_COURSES) - set(rows)
    assert not missing, f"docs/go2_sim.md's task table lacks {sorted(missing)}"
