"""The go2_flat graph for `ros2 launch`:

    ros2 launch simdist_planner go2_flat.launch.py
        robot:=sim|real checkpoint:=DIR [record:=true ...]

Same node set and parameters as `simdist launch go2_flat ...`
(simdist_planner.ros.launch_description).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _simdist_graph import generate  # noqa: E402


def generate_launch_description():
    return generate("go2_flat")
