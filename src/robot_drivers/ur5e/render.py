"""Offscreen camera rendering (RGB and robot segmentation) with shadows off for CPU speed.

The GL backend comes from MUJOCO_GL: `egl` (Mesa software EGL here, a GPU's EGL elsewhere) or
`osmesa`. It must be set before mujoco is first imported.
"""

from __future__ import annotations

import functools
import importlib.util

import mujoco
import numpy as np

from robot_drivers.ur5e.scene import robot_body_ids


@functools.cache
def _load_triton_first() -> None:
    """Load triton (if installed) before the first GL context: a process that has created a Mesa
    EGL context segfaults on a later first import of triton, which torch pulls in lazily (e.g.
    when an optimiser is built), so a process that renders and then trains would crash."""
    if importlib.util.find_spec("triton") is not None:
        import triton  # noqa: F401, PLC0415 - see the docstring: must load before the first GL context


class CameraRig:
    """One mujoco.Renderer shared by every camera of a scene."""

    def __init__(self, model: mujoco.MjModel, cameras: tuple[str, ...], size: tuple[int, int]):
        for c in cameras:
            if mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, c) < 0:
                raise ValueError(f"scene has no camera {c!r}")
        self.model, self.cameras, self.size = model, tuple(cameras), size
        self._renderer: mujoco.Renderer | None = None
        robot_bodies = set(robot_body_ids(model).tolist())
        self.robot_geoms = np.array(
            [g for g in range(model.ngeom) if model.geom_bodyid[g] in robot_bodies], int
        )

    def _get(self) -> mujoco.Renderer:
        if self._renderer is None:
            _load_triton_first()
            try:
                self._renderer = mujoco.Renderer(self.model, *self.size)
            except Exception as e:  # a missing GL library reports many exception types
                raise RuntimeError(
                    f"offscreen rendering failed ({e}); set MUJOCO_GL=egl (or osmesa) before "
                    "importing mujoco and install the Mesa EGL/OSMesa libraries"
                ) from e
        return self._renderer

    def _update(self, data: mujoco.MjData, camera: str) -> mujoco.Renderer:
        r = self._get()
        r.update_scene(data, camera=camera)
        r.scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = 0
        r.scene.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0
        return r

    def render(self, data: mujoco.MjData) -> dict[str, np.ndarray]:
        """camera -> (H, W, 3) uint8 RGB."""
        return {c: self._update(data, c).render().copy() for c in self.cameras}

    def robot_mask(self, data: mujoco.MjData, camera: str) -> np.ndarray:
        """(H, W) bool: pixels showing the arm or the gripper."""
        if mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_CAMERA, camera) < 0:
            raise ValueError(f"unknown camera {camera!r}; cameras: {self.cameras}")
        r = self._update(data, camera)
        r.enable_segmentation_rendering()
        try:
            seg = r.render()
        finally:
            r.disable_segmentation_rendering()
        ids, types = seg[..., 0], seg[..., 1]
        return (types == mujoco.mjtObj.mjOBJ_GEOM) & np.isin(ids, self.robot_geoms)

    def close(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None
