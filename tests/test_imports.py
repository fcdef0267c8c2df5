"""Every name is imported from the module that defines it: no module of the project re-exports
a name it imports from another of the project's modules (docs/architecture.md, "Layers").

Read from the source (ast), so a re-export fails here before anything runs: `from A import n`
with `n` imported into A from another project module, `A.n` on a module alias, and an `__all__`
that lists an imported name all count."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import ROOT

PACKAGES = (
    "robot_drivers", "simdist_planner", "simdist_adapter", "sim_video_world_model",
    "simdist_viewer",
)  # fmt: skip
# Where the project's Python lives: the packages and every file importing them.
SCANNED = ("src", "tests", "benchmarks", "scripts", "launch")


def module_path(module: str, root: Path = ROOT) -> Path | None:
    """The file of a project module (a package's __init__.py), None if `module` is none."""
    base = root / "src" / Path(*module.split("."))
    for path in (base / "__init__.py", base.with_suffix(".py")):
        if path.is_file():
            return path
    return None


class ModuleNames:
    """The names a module defines itself, and those it imports from another project module."""

    def __init__(self, path: Path):
        tree = ast.parse(path.read_text(), str(path))
        self.defined: set[str] = set()
        self.imported: dict[str, str] = {}  # name -> the project module it comes from
        self.all: list[str] = []
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.defined.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    self.defined |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
                if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                    value = node.value
                    if isinstance(value, (ast.List, ast.Tuple)):
                        self.all = [e.value for e in value.elts if isinstance(e, ast.Constant)]
            elif isinstance(node, ast.ImportFrom) and node.module and is_project(node.module):
                for alias in node.names:
                    self.imported[alias.asname or alias.name] = node.module


def is_project(module: str) -> bool:
    return module.split(".")[0] in PACKAGES


def reexports(files, root: Path = ROOT) -> list[str]:
    """Each use of a re-exported name in `files`: 'file:line: what, from where'."""
    names: dict[str, ModuleNames] = {}

    def of(module: str) -> ModuleNames | None:
        path = module_path(module, root)
        if path is None:
            return None
        if module not in names:
            names[module] = ModuleNames(path)
        return names[module]

    def check(module: str, name: str, where: str, found: list[str]) -> None:
        info = of(module)
        if info is None or module_path(f"{module}.{name}", root) is not None:
            return  # not a project module, or a submodule
        if name in info.imported and name not in info.defined:
            found.append(
                f"{where}: {name} is imported from {module}, which imports it from "
                f"{info.imported[name]}"
            )

    found: list[str] = []
    for path in files:
        tree = ast.parse(path.read_text(), str(path))
        rel = path.relative_to(root)
        aliases: dict[str, str] = {}  # local name -> project module
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and is_project(node.module):
                for alias in node.names:
                    if module_path(f"{node.module}.{alias.name}", root) is not None:
                        aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                    else:
                        check(node.module, alias.name, f"{rel}:{node.lineno}", found)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if is_project(alias.name) and alias.asname:
                        aliases[alias.asname] = alias.name
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
            ):
                check(aliases[node.value.id], node.attr, f"{rel}:{node.lineno}", found)
    for module_file in (root / "src").rglob("*.py"):
        info = ModuleNames(module_file)
        for name in info.all:
            if name in info.imported and name not in info.defined:
                found.append(
                    f"{module_file.relative_to(root)}: __all__ lists {name}, imported from "
                    f"{info.imported[name]}"
                )
    return found


def python_files(root: Path = ROOT) -> list[Path]:
    return sorted(p for d in SCANNED for p in (root / d).rglob("*.py") if ".venv" not in p.parts)


def test_no_module_reexports_a_project_name():
    found = reexports(python_files())
    assert not found, "import these names from where they are defined:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "importer",
    [
        "from robot_drivers.pkg.b import helper\n",
        "from robot_drivers.pkg import b as mod\nx = mod.helper\n",
    ],
)
def test_the_check_finds_a_reexport(tmp_path, importer):
    """A module that imports `helper` from its defining module and is then imported from, both as
    `from b import helper` and as `b.helper`, is reported; the defining module's import is not."""
    pkg = tmp_path / "src" / "robot_drivers" / "pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def helper():\n    return 1\n")
    (pkg / "b.py").write_text("from robot_drivers.pkg.a import helper\n\n__all__ = ['helper']\n")
    user = tmp_path / "user.py"
    user.write_text(importer)
    fine = tmp_path / "fine.py"
    fine.write_text("from robot_drivers.pkg.a import helper\n")
    found = reexports([user, fine], root=tmp_path)
    assert any(f.startswith("user.py") and "helper is imported from robot_drivers.pkg.b" in f
               for f in found), found  # fmt: skip
    assert any("__all__ lists helper" in f for f in found), found
    assert not any(f.startswith("fine.py") for f in found), found
