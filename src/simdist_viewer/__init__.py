"""The operator's view of a SimDist graph and of its bags, in Rerun (docs/viewer.md).

Layers (pyproject.toml): `viewer_node | cli` (the ROS node, the `simdist-view` command) over
`bag_view` (episode bags and adaptation results) over `core` (messages -> Rerun log calls) over
`robot3d` (the MuJoCo bodies in 3D) over `layout` (entity paths and the blueprint per graph).
Only `viewer_node` imports rclpy.
"""
