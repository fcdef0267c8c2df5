"""ROS 2 side: the planner node, the launch description shared by both launchers, and the pip launcher."""
