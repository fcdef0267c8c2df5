"""The package layout that colcon and pip both rely on."""

import importlib
import re
import tomllib
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from conftest import ROOT
from robot_drivers.interface import Command, CommandKind, ProprioTerm, RobotSpec, validate_command


def test_package_xml_is_format_3_ament_python():
    root = ET.parse(ROOT / "package.xml").getroot()
    assert root.get("format") == "3"
    assert root.findtext("name") == "simdist_planner"
    assert root.find("export/build_type").text == "ament_python"
    assert (ROOT / "resource" / "simdist_planner").exists()


def test_validate_command_rejects_garbage():
    spec = RobotSpec("toy", 3, 5.0, (ProprioTerm("q", 3),))
    validate_command(spec, Command(CommandKind.EE_DELTA, np.zeros(3)))
    validate_command(spec, Command(CommandKind.HOLD))
    with pytest.raises(ValueError, match="shape"):
        validate_command(spec, Command(CommandKind.EE_DELTA, np.zeros(4)))
    with pytest.raises(ValueError, match="NaN"):
        validate_command(spec, Command(CommandKind.EE_DELTA, np.array([0.0, np.nan, 0.0])))


CONSOLE_SCRIPTS = {
    "simdist-generate", "simdist-pretrain", "simdist-eval", "simdist-probe", "simdist-readout",
    "simdist-select-checkpoint", "simdist-ablation", "simdist-adapt-experiment",
    "simforcing-train", "simforcing-eval", "simdist", "planner_node", "adapter_node",
    "recorder_node", "replay_node", "video_prediction_node", "mujoco_driver_node",
    "ur5e_rtde_driver_node", "go2_sdk_driver_node", "ingestion_node", "safety_supervisor_node",
}  # fmt: skip


def _console_scripts() -> dict[str, str]:
    text = (ROOT / "setup.py").read_text()
    return dict(re.findall(r'"([\w-]+) = ([\w.]+:main)"', text))


def test_every_console_script_keeps_its_name_and_resolves_to_a_main():
    scripts = _console_scripts()
    assert CONSOLE_SCRIPTS <= set(scripts)
    for name, target in scripts.items():
        module, attr = target.split(":")
        assert callable(getattr(importlib.import_module(module), attr)), name


def test_the_import_contract_names_every_module_of_every_package():
    """A module outside every layer would escape the one-way rule unnoticed."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    for contract in contracts["contracts"]:
        for container in contract.get("containers", []):
            named = {m.strip() for layer in contract["layers"] for m in layer.split("|")}
            pkg = ROOT / "src" / container
            present = {p.stem for p in pkg.glob("*.py") if p.stem != "__init__"}
            present |= {p.name for p in pkg.iterdir() if (p / "__init__.py").is_file()}
            assert present <= named, f"{container}: {sorted(present - named)} in no layer"
