"""Render-only levels of detail for the arm's visual meshes.

The menagerie UR5e + 2F-85 visual meshes hold about 185 k triangles. On a software GL (Mesa
llvmpipe, every CPU machine here) vertex work dominates: 64 x 64 images cost ~24 ms per camera
with them and ~2 ms without, while at that resolution a 1,000-triangle mesh looks the same.
`decimate_visual_meshes` points every visual-only geom at a decimated copy of its mesh and leaves
collision meshes, masses and inertias exactly as they were, so the setting changes pixels only,
never physics.
"""

from __future__ import annotations

import hashlib
import sys
import zipfile

import fast_simplification
import mujoco
import numpy as np

from robot_drivers.cache import cache_dir, save_npz_atomic

RENDER_SUFFIX = "_render"
LOD_VERSION = 1  # bump when _simplify changes: cache entries are keyed by it


def _is_visual_mesh_geom(geom: mujoco.MjsGeom) -> bool:
    return geom.type == mujoco.mjtGeom.mjGEOM_MESH and geom.contype == 0 and geom.conaffinity == 0


def _simplify(
    v: np.ndarray, f: np.ndarray, max_faces: int, tolerance: float
) -> tuple[np.ndarray, np.ndarray]:
    """Quadric decimation to at most `max_faces` triangles, doubling the budget until the mesh's
    bounding box moves by less than `tolerance` (m); the welded input when nothing qualifies."""

    # OBJ assets arrive with vertices split per normal / texture seam; unwelded, every seam is a
    # boundary the decimation tears open
    v, inverse = np.unique(np.round(v, 7), axis=0, return_inverse=True)
    f = inverse.reshape(-1)[f].astype(np.int32)
    f = f[(f[:, 0] != f[:, 1]) & (f[:, 1] != f[:, 2]) & (f[:, 0] != f[:, 2])]
    target = max_faces
    while target < len(f):
        pts, tri = fast_simplification.simplify(v, f, target_reduction=1.0 - target / len(f))
        moved = max(np.abs(pts.min(0) - v.min(0)).max(), np.abs(pts.max(0) - v.max(0)).max())
        if len(tri) and moved < tolerance:
            return pts, tri.astype(np.int32)
        target *= 2
    return v, f


def _simplified(
    v: np.ndarray, f: np.ndarray, max_faces: int, tolerance: float
) -> tuple[np.ndarray, np.ndarray]:
    """`_simplify`, cached on disk: the arm's meshes take ~5 s to decimate, once per machine."""
    h = hashlib.sha256(repr((LOD_VERSION, max_faces, tolerance)).encode())
    h.update(v.tobytes())
    h.update(f.tobytes())
    path = cache_dir() / "mesh_lod" / f"{h.hexdigest()[:24]}.npz"
    if path.exists():
        try:
            with np.load(path, allow_pickle=False) as z:
                return z["vert"], z["face"]
        except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
            print(f"mesh_lod: unreadable cache entry {path} ({e}); recomputing", file=sys.stderr)
    pts, tri = _simplify(v, f, max_faces, tolerance)
    save_npz_atomic(path, vert=pts, face=tri)
    return pts, tri


def decimate_visual_meshes(
    spec: mujoco.MjSpec, max_faces: int, tolerance: float = 2e-3
) -> dict[str, int]:
    """Give every visual-only mesh geom with more than `max_faces` triangles a decimated copy
    (`<mesh>_render`); `tolerance` (2 mm) is under a pixel of every 64 x 64 camera. Bodies get
    their compiled inertial properties as explicit ones first, so the new meshes cannot change
    any mass. Returns mesh name -> triangles kept, for the meshes that were decimated."""
    if max_faces < 4:
        raise ValueError(f"max_faces must be at least 4, got {max_faces}")
    model = spec.compile()
    for body in spec.bodies:
        if body.name == "world":
            continue
        b = model.body(body.name)
        body.explicitinertial = True
        body.mass = float(b.mass[0])
        body.ipos, body.iquat, body.inertia = b.ipos.copy(), b.iquat.copy(), b.inertia.copy()
    kept: dict[str, int] = {}
    full: set[str] = set()  # meshes at or under the budget, or that decimate no further
    for geom in spec.geoms:
        name = geom.meshname
        if not _is_visual_mesh_geom(geom) or name in full:
            continue
        if name not in kept:
            mid = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_MESH, name)
            nf = int(model.mesh_facenum[mid])
            if nf > max_faces:
                va, nv, fa = (
                    model.mesh_vertadr[mid],
                    model.mesh_vertnum[mid],
                    model.mesh_faceadr[mid],
                )
                pts, tri = _simplified(
                    model.mesh_vert[va : va + nv].astype(np.float64),
                    model.mesh_face[fa : fa + nf].astype(np.int32),
                    max_faces,
                    tolerance,
                )
            if nf <= max_faces or len(tri) >= nf:
                full.add(name)
                continue
            # compiled vertices sit in the mesh's inertial frame; the geom expects the asset's
            rot = np.zeros(9)
            mujoco.mju_quat2Mat(rot, model.mesh_quat[mid])
            pts = pts @ rot.reshape(3, 3).T + model.mesh_pos[mid]
            spec.add_mesh(
                name=name + RENDER_SUFFIX,
                uservert=pts.ravel().tolist(),
                userface=tri.ravel().tolist(),
                inertia=mujoco.mjtMeshInertia.mjMESH_INERTIA_SHELL,
            )
            kept[name] = len(tri)
        geom.meshname = name + RENDER_SUFFIX
    return kept
