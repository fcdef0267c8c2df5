"""Task options are typed once (robot_drivers.tasks.options): the dataclass of a task family
validates every value, and the commands' flags, the MuJoCo driver's parameters and the launch
arguments are built from its descriptions, so a bad option gets the validator's one message
whichever way it comes in."""

from __future__ import annotations

import pytest
from rclpy.parameter import Parameter

from robot_drivers import mujoco_driver_node, registry
from robot_drivers.mujoco_driver_node import MujocoDriverNode
from robot_drivers.tasks.options import Go2Options, Ur5eOptions
from robot_ros_helpers import RosHarness
from simdist_adapter import experiment
from simdist_planner.cli import evaluate as eval_cli
from simdist_planner.ros import launch_description as desc

# (task, variant, graph running it for that variant, option, bad value)
BAD = [
    ("slippery_slope", "real", "go2_slope", "panel_friction", -0.1),
    ("slippery_slope", "real", "go2_slope", "speed", 5.0),
    ("foam", "real", "go2_foam", "panel_friction", 0.12),  # the foam stand-in has no panels
]


def _message(task: str, variant: str, name: str, value) -> str:
    with pytest.raises(ValueError) as raised:
        registry.entry(task).options.of(task, variant, **{name: value})
    return str(raised.value)


def test_the_options_validate_values_and_where_they_apply():
    assert Go2Options(speed=0.3, panel_friction=0.12).given() == {
        "speed": 0.3,
        "panel_friction": 0.12,
    }
    with pytest.raises(ValueError, match=r"speed must be > 0 and <= 2, got 0.0"):
        Go2Options(speed=0.0)
    with pytest.raises(ValueError, match=r"max_steps must be an integer, got 2.5"):
        Go2Options(max_steps=2.5)  # type: ignore[arg-type]  # a bad value on purpose
    with pytest.raises(ValueError, match="panel_friction must be > 0 and <= 2, got nan"):
        Go2Options(panel_friction=float("nan"))
    with pytest.raises(ValueError, match="region must be one of narrow, wide, got 'left'"):
        Ur5eOptions(region="left")
    with pytest.raises(ValueError, match="image_size must be a tuple of 2 int"):
        Ur5eOptions(image_size=(64,))  # type: ignore[arg-type]  # a bad value on purpose
    assert Ur5eOptions(image_size=[64, 64]).image_size == (64, 64)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="applies to slippery_slope variant 'real' only"):
        Go2Options(panel_friction=0.12).check("slippery_slope", "sim")
    with pytest.raises(ValueError, match="speed: not an option of task 'peg'"):
        Ur5eOptions.of("peg", "sim", speed=0.3)
    # a ROS parameter's or launch argument's 0 / '' is "not set" there, and nowhere else
    assert Go2Options.of("go2_flat", "sim", unset_values=True, speed=0.0).speed is None
    with pytest.raises(ValueError, match="speed must be > 0"):
        Go2Options.of("go2_flat", "sim", speed=0.0)


@pytest.mark.parametrize(("task", "variant", "graph", "name", "value"), BAD)
def test_a_bad_option_gets_the_validators_message_from_every_entry_point(
    task, variant, graph, name, value, capsys
):
    expected = _message(task, variant, name, value)
    with pytest.raises(ValueError) as raised:
        registry.make_task(task, variant, **{name: value})
    assert str(raised.value) == expected
    # the driver parameter (what NodeParams asks before the node builds its task)
    values = {q.name: q.default for q in mujoco_driver_node.PARAMS}
    values.update(task=task, variant=variant, **{name: value})
    assert mujoco_driver_node._check(name, value, values) == expected
    # the launch argument, named by the option's flag
    flag = next(o.flag for o in registry.all_options() if o.name == name)
    with pytest.raises(ValueError) as raised:
        desc.resolve(graph, {"checkpoint": "/ck", "variant": variant, flag: str(value)})
    assert str(raised.value) == f"argument {flag}:={value}: {expected}"
    # the commands' flags: the parser ends with the validator's message
    argv = ["--task", task, f"--{flag.replace('_', '-')}", str(value)]
    for parse in (
        lambda: experiment.parse_args([*argv, "--checkpoint", "/ck"]),
        lambda: eval_cli.parse_args([*argv, "--variant", variant]),
    ):
        with pytest.raises(SystemExit) as exited:
            parse()
        assert exited.value.code == 2
        assert expected in capsys.readouterr().err


def test_the_flags_parameters_and_arguments_come_from_the_descriptions():
    described = {o.name: o for o in registry.all_options()}
    assert list(described) == ["max_steps", "region", "image_size", "cameras", "speed",
                               "panel_friction"]  # fmt: skip
    params = {q.name: q for q in mujoco_driver_node.OPTION_PARAMS}
    assert set(params) == {name for name, o in described.items() if o.scalar}
    assert set(params) <= {q.name for q in mujoco_driver_node.PARAMS}
    for name, q in params.items():
        assert q.default == described[name].unset_value and described[name].doc in q.doc
    go2_args = {a.name: a for a in desc.ROBOT_LAUNCH["go2"].args}
    assert go2_args["friction"].kind is float and go2_args["friction"].default == "0.0"
    assert desc.ROBOT_LAUNCH["go2"].course == (("speed", "speed"), ("panel_friction", "friction"))
    args = eval_cli.parse_args(["--task", "slippery_slope", "--variant", "real", "--friction",
                                "0.12", "--speed", "0.3", "--max-steps", "7"])  # fmt: skip
    assert (args.friction, args.speed, args.max_steps, args.region) == (0.12, 0.3, 7, None)


def test_the_driver_node_refuses_a_bad_option_parameter_with_the_validators_message(ros_domain):
    expected = _message("foam", "real", "panel_friction", 0.12)
    ros = RosHarness(ros_domain)
    try:
        values = {"robot": "go2", "task": "foam", "variant": "real", "panel_friction": 0.12}
        with pytest.raises(ValueError) as raised:
            MujocoDriverNode(
                context=ros.context,
                parameter_overrides=[Parameter(k, value=v) for k, v in values.items()],
            )
        assert str(raised.value) == (
            f"mujoco_driver: parameter panel_friction=0.12 rejected: {expected}"
        )
    finally:
        ros.close()
