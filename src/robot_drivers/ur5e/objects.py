"""Task objects: free pegs / legs and hole fixtures with stiff contacts.

MuJoCo's default soft contacts let a box peg enter a zero-clearance hole (about 1 mm of sideways
penetration acts as a chamfer). These stiff parameters keep penetration <= 0.1 mm, so clearance
means something and a misaligned peg jams.
"""

from __future__ import annotations

from dataclasses import dataclass

import mujoco
import numpy as np

STIFF_SOLREF = (0.004, 1.0)
STIFF_SOLIMP = (0.99, 0.999, 0.0005, 0.5, 2.0)


@dataclass(frozen=True)
class HoleFixture:
    """A block with a vertical hole: square (4 boxes) or round (a ring of `sides` boxes)."""

    center: tuple[float, float] = (0.22, 0.50)
    hole_half_width: float = 0.008  # the object's half width / radius
    clearance: float = 0.001  # per side
    height: float = 0.04
    wall: float = 0.04  # wall thickness
    sides: int = 4  # 4: square hole; more: polygonal approximation of a round hole
    friction: float = 1.0
    rgba: tuple[float, float, float, float] = (0.3, 0.35, 0.6, 1.0)

    @property
    def top_z(self) -> float:
        return self.height


def add_hole_fixture(spec: mujoco.MjSpec, fx: HoleFixture, name: str = "fixture") -> None:
    """Walls around the hole; the hole's floor is the table."""
    body = spec.worldbody.add_body(name=name, pos=[fx.center[0], fx.center[1], 0.0])
    inner = fx.hole_half_width + fx.clearance
    if fx.sides == 4:
        # two long walls in x, two short ones in y: a square hole of half width `inner`
        outer = inner + fx.wall
        walls = [
            ((0.0, inner + fx.wall / 2), (outer, fx.wall / 2)),
            ((0.0, -inner - fx.wall / 2), (outer, fx.wall / 2)),
            ((inner + fx.wall / 2, 0.0), (fx.wall / 2, inner)),
            ((-inner - fx.wall / 2, 0.0), (fx.wall / 2, inner)),
        ]
        for i, ((x, y), (hx, hy)) in enumerate(walls):
            _wall(body, f"{name}_wall{i}", [x, y, fx.height / 2], [hx, hy, fx.height / 2], 0.0, fx)
    else:
        # a regular polygon of boxes whose inner faces sit at distance `inner` from the axis
        half_side = (inner + fx.wall) * np.tan(np.pi / fx.sides) + 1e-4
        for i in range(fx.sides):
            a = 2 * np.pi * i / fx.sides
            r = inner + fx.wall / 2
            _wall(
                body,
                f"{name}_wall{i}",
                [r * np.cos(a), r * np.sin(a), fx.height / 2],
                [fx.wall / 2, half_side, fx.height / 2],
                a,
                fx,
            )


def _wall(body, name, pos, size, yaw, fx: HoleFixture) -> None:
    body.add_geom(
        name=name,
        type=mujoco.mjtGeom.mjGEOM_BOX,
        pos=pos,
        size=size,
        quat=[np.cos(yaw / 2), 0, 0, np.sin(yaw / 2)],
        rgba=list(fx.rgba),
        friction=[fx.friction, 0.005, 0.0001],
        condim=4,
        solref=list(STIFF_SOLREF),
        solimp=list(STIFF_SOLIMP),
    )


@dataclass(frozen=True)
class FreeObject:
    """The object the robot inserts: a square box peg or a round (cylinder) leg."""

    shape: str = "box"  # "box" or "cylinder"
    half_width: float = 0.008  # box half side / cylinder radius
    half_length: float = 0.035
    mass: float = 0.05
    friction: float = 1.0
    rgba: tuple[float, float, float, float] = (0.85, 0.25, 0.2, 1.0)


def add_free_object(spec: mujoco.MjSpec, obj: FreeObject, name: str) -> None:
    if obj.shape not in ("box", "cylinder"):
        raise ValueError(f"object shape must be 'box' or 'cylinder', got {obj.shape!r}")
    body = spec.worldbody.add_body(name=name, pos=[0, 0, obj.half_length])
    body.add_freejoint(name=f"{name}_free")
    if obj.shape == "box":
        kind, size = mujoco.mjtGeom.mjGEOM_BOX, [obj.half_width, obj.half_width, obj.half_length]
    else:
        kind, size = mujoco.mjtGeom.mjGEOM_CYLINDER, [obj.half_width, obj.half_length, 0]
    body.add_geom(
        name=f"{name}_geom",
        type=kind,
        size=size,
        mass=obj.mass,
        rgba=list(obj.rgba),
        friction=[obj.friction, 0.005, 0.0001],
        condim=4,
        solref=list(STIFF_SOLREF),
        solimp=list(STIFF_SOLIMP),
    )
