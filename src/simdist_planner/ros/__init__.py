"""ROS 2 side: the planner node, the launch description and the pip launcher.

The launch description is shared by both launchers (`ros2 launch` and `simdist launch`).
"""
