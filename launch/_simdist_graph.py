"""Shared body of the launch_ros files: turns `launch_description.resolve()` into launch_ros Nodes.

The graph itself (nodes, parameters, remappings, arguments) lives only in
`simdist_planner.ros.launch_description`; the pip launcher (`simdist launch`) reads the same data.
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node

from simdist_planner.ros import launch_description as desc


def _nodes(context, graph_name):
    given = {
        a.name: LaunchConfiguration(a.name).perform(context) for a in desc.graph_args(graph_name)
    }
    graph = desc.resolve(graph_name, given)
    return [
        Node(
            package="simdist_planner",
            executable=node.executable,
            name=node.name,
            parameters=[str(node.params_file), node.overrides],
            remappings=list(node.remappings),
            ros_arguments=["--enclave", node.enclave] if node.enclave else [],
            additional_env=graph.env,
            output="screen",
            respawn=node.respawn,
            respawn_delay=desc.RESPAWN_DELAY_S,
        )
        for node in graph.nodes
    ]


def generate(graph_name):
    """The LaunchDescription of one graph: its declared arguments, then its nodes."""
    arguments = [
        DeclareLaunchArgument(
            a.name,
            default_value=a.default,
            description=a.description,
            choices=list(a.choices) or None,
        )
        for a in desc.graph_args(graph_name)
    ]
    return LaunchDescription([*arguments, OpaqueFunction(function=_nodes, args=[graph_name])])
