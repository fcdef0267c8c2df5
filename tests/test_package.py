"""The package layout that colcon and pip both rely on."""

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
