"""docs/extending.md, "A node", followed at run time: a core without ROS whose typed config
describes its setting once, a thin node declaring it, a NodeSpec in the robot's node set and a
section in the graph's parameter file; the launch description resolves it, and the node, started
with what the launcher hands it, answers through its core. (Steps 2 and 3, setup.py and
pyproject.toml, are files: tests/test_extending.py checks them for every node.)"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import yaml
from rclpy.exceptions import InvalidParameterValueException
from rclpy.node import Node
from rclpy.parameter import Parameter
from std_msgs.msg import Float64

from robot_drivers.described import setting, settings
from robot_drivers.node_params import NodeParams
from robot_ros_helpers import RosHarness
from simdist_planner.ros import launch_description as desc


@dataclass(frozen=True)
class ScaleConfig:
    """The new node's one setting, described once (step 1)."""

    gain: float = field(
        default=1.0, metadata=setting("factor the input is scaled by", low=0.0, high=10.0)
    )


class ScaleCore:
    """The decision, without ROS (step 1)."""

    def __init__(self, config: ScaleConfig):
        self.config = config

    def answer(self, value: float) -> float:
        return self.config.gain * value


class ScaleNode(Node):
    """The thin node: parameters from the config's description, messages through the core."""

    def __init__(self, **kwargs):
        super().__init__("scale", **kwargs)
        self.params = NodeParams(self, settings(ScaleConfig()))
        self.core = ScaleCore(ScaleConfig(**self.params.values))
        out = self.create_publisher(Float64, "/scale/out", 10)
        self.create_subscription(
            Float64, "/scale/in", lambda m: out.publish(Float64(data=self.core.answer(m.data))), 10
        )


def test_a_new_node_by_the_guides_steps_is_launched_and_answers(monkeypatch, tmp_path, ros_domain):
    nodes = desc._nodes
    spec = desc.NodeSpec("scale", "scale_node", when=(("robot", ("sim",)),))
    monkeypatch.setattr(desc, "_nodes", lambda robot: (*nodes(robot), spec))  # step 4
    params = yaml.safe_load(desc.config_path("go2_flat").read_text())
    params["scale"] = {"ros__parameters": {"gain": 2.5}}  # step 4: the graph's changes
    params_file = tmp_path / "go2_flat.yaml"
    params_file.write_text(yaml.safe_dump(params))
    graph = desc.resolve("go2_flat", {"checkpoint": "/ck", "params_file": str(params_file)})
    resolved = next(n for n in graph.nodes if n.name == "scale")
    assert resolved.executable == "scale_node" and resolved.params_file == params_file
    # start it as the launcher does: the file's section, then the overrides
    given = {**params["scale"]["ros__parameters"], **resolved.overrides}
    ros = RosHarness(ros_domain)
    try:
        ros.add(
            ScaleNode(
                context=ros.context,
                parameter_overrides=[Parameter(k, value=v) for k, v in given.items()],
            )
        )
        out = ros.collect(Float64, "/scale/out")
        pub = ros.probe.create_publisher(Float64, "/scale/in", 10)
        assert ros.spin_until(lambda: pub.publish(Float64(data=2.0)) or out)
        assert out[-1].data == 5.0
        # its range reaches ROS: a value outside it is refused when the parameter is declared
        with pytest.raises(InvalidParameterValueException, match="gain out of range"):
            ScaleNode(context=ros.context, parameter_overrides=[Parameter("gain", value=20.0)])
    finally:
        ros.close()
