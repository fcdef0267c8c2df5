"""The peg graph for `ros2 launch`:

    ros2 launch simdist_planner peg.launch.py
        robot:=sim|real checkpoint:=DIR [record:=true ...]

Same node set and parameters as `simdist launch peg ...`
(simdist_planner.ros.launch_description).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _simdist_graph import generate  # noqa: E402


def generate_launch_description():
    return generate("peg")
