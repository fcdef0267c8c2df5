"""Each robot fact is written once, in its robot's package; the rest of the stack reads it from
the RobotSpec (docs/architecture.md, "Robot interface").

The scan covers the code and the parameter files (src/, config/, launch/): a Go2 or UR5e number
written a second time fails here, as a literal vector (the default pose, the joint ranges, the
joint-target limits, the UR5e home pose, action bounds and workspace box, under any name) or as a
literal bound twice to the same name with the same value (`action_scale = 0.25` in a dataclass,
a keyword, a `Param` default or a YAML key). tests/safety_oracle.py is outside the scan on
purpose: its copy of the documented limits is what makes it an independent oracle."""

from __future__ import annotations

import ast
import collections
from pathlib import Path

import numpy as np
import pytest
import yaml

from conftest import ROOT
from robot_drivers.safety import SafetyConfig, joint_target_limits
from robot_drivers.specs import robot_spec
from robot_drivers.ur5e.config import HOME_QPOS

SCANNED = ("src", "config", "launch")
# Names under which a robot fact is set; a (name, value) pair may be written once.
FACT_NAMES = (
    "action_scale", "default_pose", "joint_low", "joint_high", "workspace_low", "workspace_high",
    "max_step_pos", "max_step_rot", "max_target_step", "HOME_QPOS", "control_hz", "decimation",
    "physics_dt",
)  # fmt: skip


GO2_HOME = "src/robot_drivers/go2/config.py"
UR5E_HOME = "src/robot_drivers/ur5e/config.py"
SAFETY_HOME = "src/robot_drivers/safety.py"


def fact_vectors() -> dict[str, tuple[str, tuple[float, ...]]]:
    """Every robot fact that is a vector, by what it is: (the file that writes it, its value as
    the code has it). Outside that file it is never a literal, and there at most once."""
    go2, ur5e = robot_spec("go2"), robot_spec("ur5e")
    target_low, target_high = joint_target_limits(go2)
    safety = SafetyConfig(robot="ur5e")
    return {
        "Go2 default pose": (GO2_HOME, go2.default_pose),
        "Go2 joint range (low)": (GO2_HOME, go2.joint_low),
        "Go2 joint range (high)": (GO2_HOME, go2.joint_high),
        "Go2 joint-target limits (low)": (SAFETY_HOME, target_low),
        "Go2 joint-target limits (high)": (SAFETY_HOME, target_high),
        "Go2 action bounds (low)": (GO2_HOME, go2.action_low),
        "Go2 action bounds (high)": (GO2_HOME, go2.action_high),
        "UR5e home pose": (UR5E_HOME, HOME_QPOS),
        "UR5e action bounds (low)": (UR5E_HOME, ur5e.action_low),
        "UR5e action bounds (high)": (UR5E_HOME, ur5e.action_high),
        "UR5e workspace box (low)": (SAFETY_HOME, safety.workspace_low),
        "UR5e workspace box (high)": (SAFETY_HOME, safety.workspace_high),
    }


def _number(node: ast.AST) -> float | None:
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _number(node.operand)
        return None if inner is None else -inner
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return float(node.value)
    return None


def _literal(node: ast.AST):
    """A number or a tuple of numbers written as a literal, else None."""
    if isinstance(node, (ast.List, ast.Tuple)):
        values = [_number(e) for e in node.elts]
        return None if any(v is None for v in values) else tuple(values)
    return _number(node)


def python_literals(path: Path):
    """(name or '', literal, line) of every literal in `path`: bound to a name (assignment,
    annotated field, keyword, a Param-like call's first two arguments) or, for a vector,
    anywhere."""
    tree = ast.parse(path.read_text(), str(path))
    bound = set()
    for node in ast.walk(tree):
        pairs = []
        if isinstance(node, ast.Assign):
            pairs = [(t.id, node.value) for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target = node.target
            name = target.id if isinstance(target, ast.Name) else ""
            pairs = [(name, node.value)]
        elif isinstance(node, ast.keyword) and node.arg:
            pairs = [(node.arg, node.value)]
        elif isinstance(node, ast.Call) and len(node.args) >= 2:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                pairs = [(first.value, node.args[1])]
        for name, value in pairs:
            literal = _literal(value)
            if literal is not None:
                bound.add(id(value))
                yield name, literal, value.lineno
    for node in ast.walk(tree):
        if isinstance(node, (ast.List, ast.Tuple)) and id(node) not in bound:
            literal = _literal(node)
            if literal is not None and len(literal) >= 3:
                yield "", literal, node.lineno


def yaml_literals(path: Path):
    """(key, literal, 0) of every number or list of numbers in a parameter file."""
    data = yaml.safe_load(path.read_text()) or {}

    def walk(value, key=""):
        if isinstance(value, dict):
            for k, v in value.items():
                yield from walk(v, str(k))
        elif isinstance(value, list) and value and all(type(v) in (int, float) for v in value):
            yield key, tuple(float(v) for v in value), 0
        elif type(value) in (int, float):
            yield key, float(value), 0

    yield from walk(data)


def copies(files, root: Path = ROOT) -> list[str]:
    """Each robot fact written more than once in `files` (paths under `root`): 'what: where,
    where, ...'."""
    vectors = {
        what: (home, tuple(float(v) for v in vec)) for what, (home, vec) in fact_vectors().items()
    }
    where = collections.defaultdict(list)
    for path in files:
        rel = path.relative_to(root)
        literals = yaml_literals(path) if path.suffix == ".yaml" else python_literals(path)
        for name, literal, line in literals:
            place = f"{rel}:{line}" if line else str(rel)
            if literal == ():
                continue
            if name in FACT_NAMES:
                where[f"{name} = {literal}"].append(place)
            if isinstance(literal, tuple):
                for what, (home, vec) in vectors.items():
                    if len(vec) == len(literal) and np.allclose(vec, literal, rtol=0, atol=1e-9):
                        # a literal outside the fact's home counts as a second copy
                        where[what] += [place] if str(rel) == home else [home, place]
    return [
        f"{what}: {', '.join(dict.fromkeys(places))}"
        for what, places in where.items()
        if len(places) > 1
    ]


def scanned_files(root: Path = ROOT) -> list[Path]:
    return sorted(p for d in SCANNED for p in (root / d).rglob("*") if p.suffix in (".py", ".yaml"))


def test_every_go2_and_ur5e_fact_is_written_once():
    found = copies(scanned_files())
    assert not found, "read these from the robot's spec instead:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "name, text",
    [
        (
            "copy.py",
            "STANDING = (-0.1, 0.8, -1.5, 0.1, 0.8, -1.5, -0.1, 1.0, -1.5, 0.1, 1.0, -1.5)\n",
        ),
        ("copy.py", "class C:\n    action_scale: float = 0.25\n"),
        ("copy.yaml", "safety:\n  ros__parameters:\n    workspace_low: [-0.45, 0.1, 0.01]\n"),
    ],
)
def test_the_scan_finds_a_second_copy(tmp_path, name, text):
    """A planted copy of the Go2 default pose (under another name), of the action scale and of
    the UR5e workspace box is found beside the one the code has."""
    planted = tmp_path / name
    planted.write_text(text)
    for home in (GO2_HOME, SAFETY_HOME):  # the originals, under the same root as the copy
        (tmp_path / home).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / home).write_text((ROOT / home).read_text())
    originals = [tmp_path / GO2_HOME, tmp_path / SAFETY_HOME]
    assert not copies(originals, root=tmp_path)
    found = copies([*originals, planted], root=tmp_path)
    assert any(name in f for f in found), found
