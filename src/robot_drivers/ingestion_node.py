"""Ingestion node: raw driver streams in, one checked, aligned observation per tick out.

Subscribes `/simdist/robot/proprio`, `/camera/<name>/image_raw` and `/height_map`; publishes the
aligned set on `/simdist/observation/*` with identical stamps, proprio last (see
docs/observation_topics.md). Bad samples (wrong encoding or size, NaN) and stale streams are
reported on /diagnostics and withhold the observation, so the safety supervisor's stale-
observation stop takes over; the node never crashes on input.
"""

from __future__ import annotations

import time
from dataclasses import replace

import rclpy
from rclpy.node import Node
from sensor_msgs.msg import Image, JointState

from robot_drivers import ros_msgs
from robot_drivers.described import Param, settings
from robot_drivers.diagnostics import Diagnostics, Level, SourceNodes
from robot_drivers.ingestion import Ingestion, IngestionConfig, StreamError
from robot_drivers.node_params import NodeParams
from robot_drivers.node_spin import spin_until_shutdown

PARAMS = (
    Param(
        "cameras",
        ["wrist", "overhead", "side"],
        "camera names (topics /camera/<name>/image_raw); [] for none",
        read_only=True,
    ),
    Param(
        "image_height",
        224,
        "model image height (pixels); images are resized to it",
        8,
        2048,
        read_only=True,
    ),
    Param("image_width", 224, "model image width (pixels)", 8, 2048, read_only=True),
    Param("camera_height", 0, "expected raw camera height; 0 accepts any", 0, 8192, read_only=True),
    Param("camera_width", 0, "expected raw camera width; 0 accepts any", 0, 8192, read_only=True),
    Param(
        "height_map_rows",
        0,
        "height map rows (Go2: 21); 0 = no height map",
        0,
        1024,
        read_only=True,
    ),
    Param("height_map_cols", 0, "height map columns (Go2: 15)", 0, 1024, read_only=True),
    # IngestionConfig's described settings (proprio_dim fixed at start-up)
    *(replace(s, read_only=s.name == "proprio_dim") for s in settings(IngestionConfig())),
)
TUNABLE = ("align_tolerance_s", "proprio_timeout_s", "camera_timeout_s", "height_map_timeout_s")


def config_from(values: dict) -> IngestionConfig:
    rows, cols = values["height_map_rows"], values["height_map_cols"]
    return IngestionConfig(
        cameras=tuple(c for c in values["cameras"] if c),
        image_size=(values["image_height"], values["image_width"]),
        camera_size=(values["camera_height"], values["camera_width"]),
        height_map_shape=(rows, cols) if rows and cols else None,
        proprio_dim=values["proprio_dim"],
        **{k: values[k] for k in TUNABLE},
    )


class IngestionNode(Node):
    def __init__(self, **kwargs):
        super().__init__("ingestion", **kwargs)
        self.params = NodeParams(self, PARAMS)
        self.core = Ingestion(config_from(self.params.values))
        cfg = self.core.config
        self.diag = Diagnostics(self)
        self.stats = {"published": 0, "rejected": 0, "withheld_stale": 0, "image_ms_mean": 0.0}
        self._image_s, self._images = 0.0, 0
        self._frame_id = ""  # the robot name the driver put on its proprio, passed through
        self.pub_images = {
            c: self.create_publisher(Image, f"/simdist/observation/image/{c}", 10)
            for c in cfg.cameras
        }
        self.pub_height = (
            self.create_publisher(Image, "/simdist/observation/height_map", 10)
            if cfg.height_map_shape
            else None
        )
        self.pub_proprio = self.create_publisher(JointState, "/simdist/observation/proprio", 10)
        self.create_subscription(JointState, "/simdist/robot/proprio", self.on_proprio, 10)
        for c in cfg.cameras:
            self.create_subscription(
                Image, f"/camera/{c}/image_raw", lambda m, c=c: self.on_image(c, m), 10
            )
        if cfg.height_map_shape:
            self.create_subscription(Image, "/height_map", self.on_height_map, 10)
        self.sources = SourceNodes(
            self,
            {
                "proprio": "/simdist/robot/proprio",
                **{c: f"/camera/{c}/image_raw" for c in cfg.cameras},
                **({"height_map": "/height_map"} if cfg.height_map_shape else {}),
            },
        )
        self.create_timer(0.1, self.check_staleness)

    def now_ns(self) -> int:
        return self.get_clock().now().nanoseconds

    def _guard(self, stream: str, fn) -> None:
        """Run one input; a bad sample is dropped and reported, never raised into the executor."""
        if self.params.apply():
            for k in TUNABLE:
                setattr(self.core.config, k, self.params[k])
        try:
            fn()
        except (StreamError, ros_msgs.MessageError) as e:
            self.stats["rejected"] += 1
            self.diag.set(stream, Level.ERROR, f"sample rejected: {e}", **self.stats)
            return
        if self.diag.level(stream) != Level.OK:  # first valid sample, or recovered from a bad one
            self.diag.set(stream, Level.OK, "receiving valid samples")
        self.publish_aligned()

    def on_proprio(self, msg: JointState) -> None:
        def add():
            proprio, command = ros_msgs.split_proprio_msg(msg)
            names = list(msg.name)
            self._frame_id = msg.header.frame_id
            self.core.add_proprio(ros_msgs.stamp_ns(msg.header.stamp), proprio, command, names)

        self._guard("proprio", add)

    def on_image(self, camera: str, msg: Image) -> None:
        def add():
            t0 = time.perf_counter()
            image = ros_msgs.image_from_msg(msg)
            self.core.add_image(camera, ros_msgs.stamp_ns(msg.header.stamp), image)
            self._image_s += time.perf_counter() - t0
            self._images += 1
            self.stats["image_ms_mean"] = round(1e3 * self._image_s / self._images, 3)

        self._guard(camera, add)

    def on_height_map(self, msg: Image) -> None:
        self._guard(
            "height_map",
            lambda: self.core.add_height_map(
                ros_msgs.stamp_ns(msg.header.stamp), ros_msgs.height_map_from_msg(msg)
            ),
        )

    def publish_aligned(self) -> None:
        for obs in self.core.pop_aligned():
            stale = self.core.stale(self.now_ns())
            if stale:
                self.stats["withheld_stale"] += 1
                continue  # check_staleness reports which stream
            stamp_ns = obs.stamp_ns
            for c, image in obs.images.items():
                self.pub_images[c].publish(ros_msgs.image_to_msg(image, stamp_ns, f"{c}_camera"))
            if self.pub_height is not None and obs.height_map is not None:
                self.pub_height.publish(ros_msgs.height_map_to_msg(obs.height_map, stamp_ns))
            self.pub_proprio.publish(
                ros_msgs.pack_proprio(
                    obs.proprio_names, obs.proprio, obs.command, stamp_ns, self._frame_id
                )
            )
            self.stats["published"] += 1

    def check_staleness(self) -> None:
        stale = self.core.stale(self.now_ns())
        waiting = sorted(
            s for s in stale if self.core.last_stamp[s] is None
        )  # start-up, not a fault
        for s in self.core.streams:
            if s in waiting:
                self.diag.set(f"{s} freshness", Level.WARN, "waiting for the first sample")
            elif s in stale:
                self.diag.set(
                    f"{s} freshness",
                    Level.ERROR,
                    f"stale: {stale[s]} on {self.sources.describe(s)}; observation withheld",
                )
            else:
                self.sources.refresh(s)
                self.diag.set(f"{s} freshness", Level.OK, "fresh")
        if not stale:
            level, text = Level.OK, "publishing aligned observations"
        elif len(waiting) == len(stale):
            level, text = Level.WARN, f"waiting for {waiting}"
        else:
            level, text = Level.ERROR, f"withheld: stale {sorted(set(stale) - set(waiting))}"
        self.diag.set("observation", level, text, unmatched=self.core.unmatched, **self.stats)


def main(args=None):
    with rclpy.init(args=args):
        node = IngestionNode()
        spin_until_shutdown(node)


if __name__ == "__main__":
    main()
