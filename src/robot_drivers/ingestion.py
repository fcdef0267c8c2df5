"""Ingestion core: checks, resizes and time-aligns camera / proprio / height-map streams.

The ROS node (`ingestion_node.py`) decodes messages with `ros_msgs` and feeds this class; it
returns complete observations whose streams were captured within `align_tolerance_s` of the
proprio stamp, and only while no stream is stale. Anything wrong raises `StreamError` naming
the stream, what it got and what it expected; the bad sample is dropped, nothing is forwarded for
it, and the caller reports it on /diagnostics.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

import numpy as np

from robot_drivers.described import setting


class StreamError(ValueError):
    """A sample that must not reach the planner (wrong size, NaN, layout change)."""


@dataclass
class IngestionConfig:
    cameras: tuple[str, ...] = ()
    image_size: tuple[int, int] = (224, 224)  # (height, width) the model expects
    camera_size: tuple[int, int] = (0, 0)  # expected raw (height, width); (0, 0) accepts any
    height_map_shape: tuple[int, int] | None = None
    # Each described setting (doc, range) is the ingestion node's parameter of that name.
    proprio_dim: int = field(
        default=0,
        metadata=setting(
            "expected proprio length; 0 accepts any fixed length", low=0, high=100_000
        ),
    )
    align_tolerance_s: float = field(
        default=0.02,
        metadata=setting(
            "max |stamp difference| between a stream sample and the proprio stamp",
            low=0.0,
            high=1.0,
        ),
    )
    proprio_timeout_s: float = field(
        default=0.5,
        metadata=setting("proprio older than this is stale -> no observation", low=0.01, high=10.0),
    )
    camera_timeout_s: float = field(
        default=0.5,
        metadata=setting(
            "a camera image older than this is stale -> no observation", low=0.01, high=10.0
        ),
    )
    height_map_timeout_s: float = field(
        default=0.5,
        metadata=setting(
            "a height map older than this is stale -> no observation", low=0.01, high=10.0
        ),
    )
    buffer: int = 16  # samples kept per stream for alignment

    def __post_init__(self) -> None:
        self.cameras = tuple(self.cameras)
        if len(set(self.cameras)) != len(self.cameras):
            raise ValueError(f"camera names must be unique, got {self.cameras}")
        if min(self.image_size) < 1 or min(self.camera_size) < 0:
            raise ValueError(
                "image_size must be positive and camera_size >= 0, "
                f"got {self.image_size}, {self.camera_size}"
            )
        for name in (
            "align_tolerance_s",
            "proprio_timeout_s",
            "camera_timeout_s",
            "height_map_timeout_s",
        ):
            if not getattr(self, name) >= 0:
                raise ValueError(f"IngestionConfig.{name} must be >= 0, got {getattr(self, name)}")
        if self.buffer < 1:
            raise ValueError(f"IngestionConfig.buffer must be >= 1, got {self.buffer}")

    def timeout(self, stream: str) -> float:
        """How old a stream's newest sample may be before the stream is stale.

        Args:
            stream: "proprio", "height_map" or a camera name.

        Returns:
            The limit in seconds.
        """
        if stream == "proprio":
            return self.proprio_timeout_s
        return self.height_map_timeout_s if stream == "height_map" else self.camera_timeout_s


@dataclass
class AlignedObservation:
    stamp_ns: int  # the proprio stamp every stream was aligned to
    proprio: np.ndarray
    command: np.ndarray | None
    proprio_names: list[str]
    images: dict[str, np.ndarray] = field(default_factory=dict)  # model resolution, uint8 RGB
    height_map: np.ndarray | None = None


def resize(image: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """Resize an image: exact block averaging for integer down-scales, else bilinear.

    Args:
        image: (H, W, 3) uint8.
        size: (height, width) wanted.

    Returns:
        The (height, width, 3) uint8 image (`image` itself when it has that size).
    """
    h, w = image.shape[:2]
    th, tw = size
    if (h, w) == (th, tw):
        return image
    if h % th == 0 and w % tw == 0:
        fh, fw = h // th, w // tw
        acc = np.zeros((th, tw, image.shape[2]), np.uint32)
        for dy in range(fh):  # f*f strided adds beat a reshape-sum on a non-contiguous view
            for dx in range(fw):
                acc += image[dy::fh, dx::fw]
        return ((acc + (fh * fw) // 2) // (fh * fw)).astype(np.uint8)
    # bilinear with half-pixel centres (like OpenCV INTER_LINEAR); gather rows in uint8 first
    ys = np.clip((np.arange(th) + 0.5) * h / th - 0.5, 0, h - 1)
    xs = np.clip((np.arange(tw) + 0.5) * w / tw - 0.5, 0, w - 1)
    y0, x0 = ys.astype(np.int64), xs.astype(np.int64)
    y1, x1 = np.minimum(y0 + 1, h - 1), np.minimum(x0 + 1, w - 1)
    wy, wx = (
        (ys - y0).astype(np.float32)[:, None, None],
        (xs - x0).astype(np.float32)[None, :, None],
    )
    rows = np.take(image, np.concatenate([y0, y1]), axis=0)  # (2 th, W, C) uint8
    px = np.take(rows, np.concatenate([x0, x1]), axis=1).astype(np.float32)  # (2 th, 2 tw, C)
    cols = px[:, :tw] + (px[:, tw:] - px[:, :tw]) * wx
    out = cols[:th] + (cols[th:] - cols[:th]) * wy
    return (out + 0.5).astype(np.uint8)


class Ingestion:
    """Per-stream buffers, checks and nearest-stamp alignment on the proprio stamps."""

    def __init__(self, config: IngestionConfig):
        self.config = config
        self.streams = ("proprio", *config.cameras) + (
            ("height_map",) if config.height_map_shape else ()
        )
        self._buffers: dict[str, collections.deque] = {
            s: collections.deque(maxlen=config.buffer) for s in self.streams
        }
        self._pending: collections.deque = collections.deque(
            maxlen=config.buffer
        )  # proprio to align
        self.last_stamp: dict[str, int | None] = {s: None for s in self.streams}  # ns
        self._names: list[str] | None = None
        self.unmatched = 0  # proprio samples dropped because a stream had no sample near them

    # --- inputs (raise StreamError; the sample is then dropped) -------------------------------
    def add_proprio(
        self, stamp: int, proprio: np.ndarray, command: np.ndarray | None, names: list[str]
    ) -> None:
        """Buffer a proprio sample and queue its stamp for alignment (a lockstep republish of a tick
        re-emits its observation, so a late-joining planner still gets it).

        Args:
            stamp: its stamp, ns.
            proprio: the proprio vector.
            command: the command vector the robot reports, or None.
            names: the proprio's value names (the layout must not change).

        Returns:
            None; StreamError (the sample dropped) for a wrong size, NaN / Inf or a changed layout.
        """
        proprio = np.asarray(proprio, dtype=np.float32)
        if self.config.proprio_dim and proprio.shape != (self.config.proprio_dim,):
            raise StreamError(
                f"proprio: {proprio.size} values, expected proprio_dim={self.config.proprio_dim}"
            )
        self._check_finite("proprio: contains NaN or Inf; observation withheld", proprio, command)
        if self._names is not None and list(names) != self._names:
            raise StreamError(
                f"proprio: layout changed from {len(self._names)} to {len(names)} named values"
            )
        self._names = list(names)
        self._store("proprio", stamp, (proprio, command))
        if stamp not in self._pending:  # a lockstep republish of a tick re-emits its observation,
            self._pending.append(stamp)  # so a late-joining planner still gets it

    def add_image(self, camera: str, stamp: int, image: np.ndarray) -> None:
        """Buffer a camera image, resized to the model's resolution.

        Args:
            camera: a configured camera's name.
            stamp: its stamp, ns.
            image: (H, W, 3) uint8 at the configured camera size.

        Returns:
            None; StreamError (the sample dropped) for an unknown camera or a wrong shape or type.
        """
        if camera not in self.config.cameras:
            raise StreamError(
                f"camera {camera!r} is not configured; cameras: {self.config.cameras}"
            )
        if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
            raise StreamError(
                f"camera {camera}: image {image.shape} {image.dtype}, expected (H, W, 3) uint8"
            )
        expected = self.config.camera_size
        if expected != (0, 0) and image.shape[:2] != tuple(expected):
            raise StreamError(
                f"camera {camera}: image is {image.shape[0]}x{image.shape[1]} (HxW), "
                f"expected {expected[0]}x{expected[1]}"
            )
        self._store(camera, stamp, resize(image, self.config.image_size))

    def add_height_map(self, stamp: int, height_map: np.ndarray) -> None:
        """Buffer a height map.

        Args:
            stamp: its stamp, ns.
            height_map: the grid, of the configured height_map_shape.

        Returns:
            None; StreamError (the sample dropped) when none is configured, for a wrong shape or
            NaN / Inf.
        """
        shape = self.config.height_map_shape
        if shape is None:
            raise StreamError("height map received but height_map_shape is not configured")
        if height_map.shape != tuple(shape):
            raise StreamError(f"height map is {height_map.shape}, expected {tuple(shape)}")
        self._check_finite("height map contains NaN or Inf", height_map)
        self._store("height_map", stamp, height_map.astype(np.float32))

    @staticmethod
    def _check_finite(error: str, *arrays: np.ndarray | None) -> None:
        """Guard: a sample with NaN or Inf is dropped (StreamError `error`), never aligned."""
        if not all(np.all(np.isfinite(a)) for a in arrays if a is not None):
            raise StreamError(error)

    def _store(self, stream: str, stamp: int, value) -> None:
        """Buffer a sample; a repeat of the newest stamp (a lockstep republish) replaces it."""
        buf = self._buffers[stream]
        if buf and stamp == buf[-1][0]:
            buf[-1] = (stamp, value)
            return
        if buf and stamp < buf[-1][0]:
            buf.clear()  # time went backwards (replay restarted): old samples are meaningless
            if stream == "proprio":
                self._pending.clear()
        buf.append((stamp, value))
        self.last_stamp[stream] = stamp

    # --- outputs ------------------------------------------------------------------------------
    def stale(self, now_ns: int) -> dict[str, str]:
        """The streams that are stale now.

        Args:
            now_ns: the node clock, ns.

        Returns:
            Stream -> why it is stale (never received, or its last sample too old); {} when none is.
        """
        out = {}
        for s in self.streams:
            last, limit = self.last_stamp[s], self.config.timeout(s)
            if last is None:
                out[s] = "no sample received yet"
            elif (now_ns - last) * 1e-9 > limit:
                out[s] = f"last sample {(now_ns - last) * 1e-9:.3f} s old (limit {limit} s)"
        return out

    def _nearest(self, stream: str, stamp: int):
        buf = self._buffers[stream]
        if not buf:
            return None
        best = min(buf, key=lambda item: abs(item[0] - stamp))
        return best if abs(best[0] - stamp) <= self._tol_ns() else None

    def _tol_ns(self) -> int:
        return round(self.config.align_tolerance_s * 1e9)

    def pop_aligned(self) -> list[AlignedObservation]:
        """Complete observations for the pending proprio stamps, oldest first; a stamp that can no
        longer complete (a newer sample of a missing stream already passed) is dropped and counted
        in `unmatched`.

        Returns:
            The AlignedObservations completed since the last call.
        """
        out = []
        tol = self._tol_ns()
        while self._pending:
            stamp = self._pending[0]
            matches = {s: self._nearest(s, stamp) for s in self.streams if s != "proprio"}
            missing = [s for s, m in matches.items() if m is None]
            if missing:
                if any(
                    self.last_stamp[s] is not None and self.last_stamp[s] > stamp + tol
                    for s in missing
                ):
                    # a newer sample already passed: this stamp cannot complete
                    self._pending.popleft()
                    self.unmatched += 1
                    continue
                break
            self._pending.popleft()
            proprio, command = self._nearest("proprio", stamp)[1]
            assert self._names is not None  # add_proprio set them when it queued this stamp
            out.append(
                AlignedObservation(
                    stamp_ns=stamp,
                    proprio=proprio,
                    command=command,
                    proprio_names=list(self._names),
                    images={c: matches[c][1] for c in self.config.cameras},
                    height_map=matches["height_map"][1] if "height_map" in matches else None,
                )
            )
        return out
