"""The public functions of the registry, the task options, the planner protocol, the cores and
the adapter say what they take and give: an `Args:` section (where they take arguments) and a
`Returns:` section (what they give, and what they raise instead of returning)."""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODULES = (
    "src/robot_drivers/registry.py",
    "src/robot_drivers/tasks/options.py",
    "src/robot_drivers/safety.py",
    "src/robot_drivers/ingestion.py",
    "src/simdist_planner/ros/planner_core.py",
    "src/simdist_adapter/adapter.py",
    "src/simdist_adapter/finetune.py",
    "src/simdist_adapter/registry.py",
)
# The Planner protocol's members and planner.py's module functions (MPPIPlanner implements the
# protocol; WorldModelLike lists the model's members the planner calls).
PLANNER = "src/simdist_planner/planning/planner.py"


def undocumented(source: str, classes: tuple[str, ...] | None = None) -> list[str]:
    """Public functions and methods (not properties) lacking Args: / Returns: sections; with
    `classes`, only the methods of those classes and the module's functions."""
    missing = []

    def visit(nodes, owner: str | None) -> None:
        for n in nodes:
            if isinstance(n, ast.ClassDef) and not n.name.startswith("_"):
                if classes is None or n.name in classes:
                    visit(n.body, n.name)
            elif isinstance(n, ast.FunctionDef) and not n.name.startswith("_"):
                if any(isinstance(d, ast.Name) and d.id == "property" for d in n.decorator_list):
                    continue
                doc = ast.get_docstring(n) or ""
                args = [
                    a.arg for a in n.args.args + n.args.kwonlyargs if a.arg not in ("self", "cls")
                ]
                if "Returns:" not in doc or (args and "Args:" not in doc):
                    missing.append(f"{owner + '.' if owner else ''}{n.name}")

    visit(ast.parse(source).body, None)
    return missing


@pytest.mark.parametrize("path", MODULES)
def test_public_functions_have_args_and_returns(path):
    assert undocumented((ROOT / path).read_text()) == []


def test_the_planner_protocol_has_args_and_returns():
    assert undocumented((ROOT / PLANNER).read_text(), classes=("Planner",)) == []


def test_a_function_without_the_sections_is_found():
    source = '''
def f(x):
    """Does f."""
class C:
    def g(self):
        """Returns:
            1."""
    def h(self, y):
        """No sections."""
'''
    assert undocumented(source) == ["f", "C.h"]
