"""UR5e hardware driver node (ur_rtde): the real arm behind the same topics as the MuJoCo one.

Publishes `/joint_states`, `/tcp_pose` and `/simdist/robot/proprio` at `publish_rate_hz`; takes
commands only from `/simdist/safe_command`; servoL runs at 500 Hz in the backend's thread.
Cameras come from their own driver nodes on `/camera/<name>/image_raw` (docs/hardware.md).
"""

from __future__ import annotations

import dataclasses

import rclpy
from geometry_msgs.msg import PoseStamped

from robot_drivers import ros_msgs
from robot_drivers.described import Param
from robot_drivers.diagnostics import Level
from robot_drivers.hardware.realtime_driver import RealtimeDriverNode
from robot_drivers.hardware.robotiq import RobotiqGripper
from robot_drivers.hardware.ur5e_rtde import UR5eRtdeBackend, UR5eRtdeConfig, connect_ur5e
from robot_drivers.interface import CommandKind
from robot_drivers.node_spin import spin_until_shutdown
from robot_drivers.ur5e.so3 import mat_to_quat

PARAMS = (
    Param("robot_ip", "", "UR5e controller address (required)", read_only=True),
    Param(
        "gripper",
        True,
        "drive a Robotiq 2F-85 through its URCap socket (port 63352)",
        read_only=True,
    ),
    Param("lookahead_time", 0.1, "servoL lookahead (s): larger is smoother, slower", 0.03, 0.2),
    Param("gain", 300.0, "servoL proportional gain", 100.0, 2000.0),
    Param(
        "world_yaw",
        0.0,
        "world frame = controller base turned by this about z (rad); 0 for the sim's mounting",
        -3.15,
        3.15,
        read_only=True,
    ),
)


class UR5eRtdeDriverNode(RealtimeDriverNode):
    SAFE_KIND = CommandKind.HOLD  # a faulted UR is already stopped by its controller
    backend: UR5eRtdeBackend

    def __init__(self, backend=None, **kwargs):
        super().__init__("ur5e_driver", PARAMS, backend, **kwargs)
        self.pub_tcp = self.create_publisher(PoseStamped, "/tcp_pose", 10)

    def connect(self) -> UR5eRtdeBackend:
        cfg = UR5eRtdeConfig(
            lookahead_time=self.params["lookahead_time"],
            gain=self.params["gain"],
            world_yaw=self.params["world_yaw"],
        )
        ip = self.params["robot_ip"]
        try:
            backend = connect_ur5e(ip, cfg)  # the arm first: its error is the one that matters
            if self.params["gripper"]:
                try:
                    backend.gripper = RobotiqGripper.connect(ip)
                except ConnectionError:
                    backend.close()
                    raise
        except (ConnectionError, OSError, ValueError) as e:
            self.diag.set("connection", Level.ERROR, str(e))
            raise
        backend.start()
        return backend

    def apply_params(self, changed: dict) -> None:
        keep = {k: v for k, v in changed.items() if k in ("lookahead_time", "gain")}
        if keep:
            self.backend.config = dataclasses.replace(self.backend.config, **keep)

    def publish_extra(self, obs, stamp_ns: int) -> None:
        p = obs.privileged
        self.pub_tcp.publish(ros_msgs.pose_msg(p["tcp_pos"], mat_to_quat(p["tcp_mat"]), stamp_ns))
        self.diag.set(
            "speed_scaling",
            Level.OK if p["speed_scaling"][0] >= 0.99 else Level.WARN,
            f"{p['speed_scaling'][0]:.2f}",
        )


def main(args=None):
    with rclpy.init(args=args):
        try:
            node = UR5eRtdeDriverNode()
        except (ConnectionError, OSError, ValueError) as e:
            print(f"ur5e_driver: {e}")
            raise SystemExit(1)
        spin_until_shutdown(node, on_exit=node.backend.close)


if __name__ == "__main__":
    main()
