"""Go2 hardware driver node (unitree_sdk2py): rt/lowcmd out at 500 Hz, rt/lowstate in.

Publishes `/joint_states`, `/imu` and `/simdist/robot/proprio`; reads the velocity command from
`/cmd_vel` and the base velocity estimate from `/odom` (twist in the base frame, from a state
estimator); takes commands only from `/simdist/safe_command`. Any fault (lost lowstate, fall)
puts the motors in damping mode until `~/reset`.
"""

from __future__ import annotations

import threading
import time

import rclpy
from geometry_msgs.msg import Twist
from nav_msgs.msg import Odometry
from sensor_msgs.msg import Imu

from robot_drivers import ros_msgs
from robot_drivers.described import Param
from robot_drivers.diagnostics import Level
from robot_drivers.hardware.go2_sdk import Go2SdkBackend, Go2SdkConfig, connect_go2
from robot_drivers.hardware.realtime_driver import RealtimeDriverNode
from robot_drivers.interface import CommandKind
from robot_drivers.node_spin import spin_until_shutdown

PARAMS = (
    Param(
        "network_interface",
        "",
        "network interface wired to the Go2, e.g. enp3s0 (required)",
        read_only=True,
    ),
    Param("lowcmd_rate_hz", 500.0, "rt/lowcmd publishing rate", 50.0, 1000.0, read_only=True),
    Param(
        "lowstate_timeout_s",
        0.1,
        "no rt/lowstate this long -> disconnected fault, damping",
        0.005,
        2.0,
        read_only=True,
    ),
)


class Go2SdkDriverNode(RealtimeDriverNode):
    SAFE_KIND = CommandKind.DAMP
    backend: Go2SdkBackend

    def __init__(self, backend=None, **kwargs):
        super().__init__("go2_driver", PARAMS, backend, **kwargs)
        self.pub_imu = self.create_publisher(Imu, "/imu", 10)
        self.create_subscription(Twist, "/cmd_vel", self.on_cmd_vel, 10)
        self.create_subscription(Odometry, "/odom", self.on_odom, 10)
        self._stop = threading.Event()
        self._writer = threading.Thread(target=self._write_loop, name="go2_lowcmd", daemon=True)
        self._writer.start()

    def connect(self) -> Go2SdkBackend:
        cfg = Go2SdkConfig(
            lowcmd_rate_hz=self.params["lowcmd_rate_hz"],
            lowstate_timeout_s=self.params["lowstate_timeout_s"],
        )
        try:
            return connect_go2(self.params["network_interface"], cfg)
        except (ImportError, ValueError) as e:
            self.diag.set("connection", Level.ERROR, str(e))
            raise

    def _write_loop(self) -> None:
        """rt/lowcmd at lowcmd_rate_hz, CRC'd, damping whenever the backend is faulted."""
        period = 1.0 / self.backend.config.lowcmd_rate_hz
        next_t = time.monotonic()
        while not self._stop.is_set():
            self.backend.publish_lowcmd()
            next_t += period
            self._stop.wait(max(0.0, next_t - time.monotonic()))

    def on_cmd_vel(self, msg: Twist) -> None:
        try:
            self.backend.set_command([msg.linear.x, msg.linear.y, msg.angular.z])
        except ValueError as e:
            self.diag.set("cmd_vel", Level.ERROR, f"velocity command ignored: {e}")

    def on_odom(self, msg: Odometry) -> None:
        v = msg.twist.twist.linear
        self.backend.set_base_velocity([v.x, v.y, v.z])

    def publish_extra(self, obs, stamp_ns: int) -> None:
        p = obs.privileged
        self.pub_imu.publish(
            ros_msgs.imu_msg(p["base_quat"], p["base_ang_vel"], p["accelerometer"], stamp_ns)
        )

    def destroy_node(self):
        self._stop.set()
        self._writer.join(timeout=1.0)
        return super().destroy_node()


def main(args=None):
    with rclpy.init(args=args):
        try:
            node = Go2SdkDriverNode()
        except (ImportError, ValueError) as e:
            print(f"go2_driver: {e}")
            raise SystemExit(1)
        spin_until_shutdown(node, on_exit=node.backend.close)


if __name__ == "__main__":
    main()
