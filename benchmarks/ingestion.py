"""Ingestion overhead per image: decode the ROS Image, check it, resize it, align it.

Runs the same code path as the ingestion node (`ros_msgs.image_from_msg` + `Ingestion.add_image`
+ alignment + re-encoding the model-resolution image) on synthetic camera frames, without DDS, and
prints milliseconds per image for a few camera -> model resolutions.

    .venv/bin/python benchmarks/ingestion.py [--frames 200]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from robot_drivers import ros_msgs
from robot_drivers.ingestion import Ingestion, IngestionConfig

CASES = [
    ((480, 640), (224, 224)),
    ((224, 224), (224, 224)),
    ((448, 448), (224, 224)),
    ((128, 128), (64, 64)),
]


def per_image_ms(camera_hw, model_hw, frames: int) -> tuple[float, float]:
    """(ms per image for decode + check + resize, ms per image with alignment and re-encode)."""
    core = Ingestion(IngestionConfig(cameras=("cam",), image_size=model_hw, camera_size=camera_hw))
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 255, (*camera_hw, 3), dtype=np.uint8)
    msgs = [ros_msgs.image_to_msg(raw, k * 1_000_000, "cam") for k in range(frames)]
    t0 = time.perf_counter()
    for k, msg in enumerate(msgs):
        core.add_image("cam", k * 1_000_000, ros_msgs.image_from_msg(msg))
    decode = (time.perf_counter() - t0) / frames
    t0 = time.perf_counter()
    for k, msg in enumerate(msgs):
        stamp = (frames + k) * 1_000_000
        core.add_image("cam", stamp, ros_msgs.image_from_msg(msg))
        core.add_proprio(stamp, np.zeros(22), None, [f"p[{i}]" for i in range(22)])
        for obs in core.pop_aligned():
            ros_msgs.image_to_msg(obs.images["cam"], obs.stamp_ns, "cam")
    total = (time.perf_counter() - t0) / frames
    return 1e3 * decode, 1e3 * total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=200)
    args = parser.parse_args()
    print(
        f"{'camera HxW':>12} {'model HxW':>10} "
        f"{'decode+check+resize ms':>24} {'+align+publish ms':>18}"
    )
    for camera_hw, model_hw in CASES:
        a, b = per_image_ms(camera_hw, model_hw, args.frames)
        print(
            f"{'x'.join(map(str, camera_hw)):>12} {'x'.join(map(str, model_hw)):>10} "
            f"{a:>24.3f} {b:>18.3f}"
        )


if __name__ == "__main__":
    main()
