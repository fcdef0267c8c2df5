"""Render-only mesh decimation (ur5e/mesh_lod.py): fewer triangles, the same physics, the same
picture within a small tolerance, and a disk cache that survives corruption."""

import mujoco
import numpy as np
import pytest

from robot_drivers.interface import Command, CommandKind
from robot_drivers.tasks.ur5e_tasks import InsertionObjects, peg_config
from robot_drivers.ur5e.backend import MujocoUR5eBackend
from robot_drivers.ur5e.config import ControllerConfig, SceneConfig
from robot_drivers.ur5e.mesh_lod import RENDER_SUFFIX, decimate_visual_meshes
from robot_drivers.ur5e.scene import compose


@pytest.fixture(scope="module")
def pair():
    """The peg scene with full meshes and with the default decimated ones."""
    full = MujocoUR5eBackend(
        SceneConfig(render_mesh_faces=0), ControllerConfig(), InsertionObjects(peg_config())
    )
    lod = MujocoUR5eBackend(SceneConfig(), ControllerConfig(), InsertionObjects(peg_config()))
    yield full, lod
    full.close()
    lod.close()


def _visible_faces(model):
    faces = 0
    for g in range(model.ngeom):
        if model.geom_type[g] == mujoco.mjtGeom.mjGEOM_MESH and model.geom_group[g] <= 2:
            faces += model.mesh_facenum[model.geom_dataid[g]]
    return faces


def test_visual_meshes_lose_most_triangles_collision_meshes_none(pair):
    full, lod = pair
    assert _visible_faces(lod.model) < 0.5 * _visible_faces(full.model)
    for g in range(full.model.ngeom):
        name = mujoco.mj_id2name(full.model, mujoco.mjtObj.mjOBJ_MESH, full.model.geom_dataid[g])
        lod_name = mujoco.mj_id2name(lod.model, mujoco.mjtObj.mjOBJ_MESH, lod.model.geom_dataid[g])
        if full.model.geom_type[g] != mujoco.mjtGeom.mjGEOM_MESH:
            continue
        if full.model.geom_contype[g] or full.model.geom_conaffinity[g]:
            assert lod_name == name  # collision geoms keep their exact mesh
        elif lod_name != name:
            assert lod_name == name + RENDER_SUFFIX


def test_masses_inertias_and_trajectories_are_identical(pair):
    full, lod = pair
    for field in ("body_mass", "body_inertia", "body_ipos", "body_iquat"):
        np.testing.assert_array_equal(getattr(full.model, field), getattr(lod.model, field))
    colliding = (full.model.geom_contype | full.model.geom_conaffinity) > 0
    for field in ("geom_size", "geom_pos", "geom_quat", "geom_friction"):
        np.testing.assert_array_equal(
            getattr(full.model, field)[colliding], getattr(lod.model, field)[colliding]
        )
    qs = []
    for b in pair:
        b.reset(3)
        for k in range(4):
            b.act(
                Command(
                    CommandKind.EE_DELTA, np.array([0.01, -0.01, -0.02, 0, 0, 0.05, float(k >= 2)])
                )
            )
            b.step()
        qs.append(b.data.qpos.copy())
    np.testing.assert_array_equal(qs[0], qs[1])


def test_images_match_the_full_meshes(pair):
    full, lod = pair
    for b in pair:
        b.reset(5)
    a, c = full.observe().images, lod.observe().images
    robot_seen = []
    for cam in a:
        diff = np.abs(a[cam].astype(int) - c[cam].astype(int))
        # measured: mean 0.1-2.1 (smoother shading of the decimated arm), <2% of pixels > 30
        assert diff.mean() < 3.0 and (diff.max(-1) > 30).mean() < 0.04, cam
        assert a[cam].std() > 5.0
        m0, m1 = full.render_robot_mask(cam), lod.render_robot_mask(cam)
        if (m0 | m1).any():  # the wrist camera looks past the open fingers
            robot_seen.append(cam)
            assert (m0 & m1).sum() / (m0 | m1).sum() > 0.97, (
                cam
            )  # the silhouette (measured >= 0.989)
    assert {"overhead", "side"} <= set(robot_seen)


def test_decimated_surfaces_stay_where_the_originals_were():
    spec = compose(SceneConfig(render_mesh_faces=0))
    before = spec.compile()
    d0 = mujoco.MjData(before)
    mujoco.mj_forward(before, d0)
    kept = decimate_visual_meshes(spec, 1000)
    after = spec.compile()
    d1 = mujoco.MjData(after)
    mujoco.mj_forward(after, d1)
    assert kept and all(n < before.mesh(name).facenum[0] for name, n in kept.items())

    def world_vertices(m, d, g):
        mid = m.geom_dataid[g]
        v = m.mesh_vert[m.mesh_vertadr[mid] : m.mesh_vertadr[mid] + m.mesh_vertnum[mid]]
        return d.geom_xpos[g] + v @ d.geom_xmat[g].reshape(3, 3).T

    checked = 0
    for g in range(before.ngeom):
        name = mujoco.mj_id2name(before, mujoco.mjtObj.mjOBJ_MESH, before.geom_dataid[g])
        visual = before.geom_contype[g] == 0 and before.geom_conaffinity[g] == 0
        if before.geom_type[g] == mujoco.mjtGeom.mjGEOM_MESH and visual and name in kept:
            a, b = world_vertices(before, d0, g), world_vertices(after, d1, g)
            assert np.abs(a.min(0) - b.min(0)).max() < 2e-3
            assert np.abs(a.max(0) - b.max(0)).max() < 2e-3
            checked += 1
    assert checked == len([g for g in spec.geoms if g.meshname.endswith(RENDER_SUFFIX)])


def test_cache_is_reused_and_a_corrupt_entry_is_recomputed(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SIMDIST_CACHE_DIR", str(tmp_path))
    first = decimate_visual_meshes(compose(SceneConfig(render_mesh_faces=0)), 500)
    entries = sorted((tmp_path / "mesh_lod").glob("*.npz"))
    assert len(entries) >= len(first) > 0  # meshes that decimate no further are cached too
    entries[0].write_bytes(b"not a zip file")
    again = decimate_visual_meshes(compose(SceneConfig(render_mesh_faces=0)), 500)
    assert again == first
    assert "unreadable cache entry" in capsys.readouterr().err


def test_bad_settings_raise():
    with pytest.raises(ValueError, match="render_mesh_faces"):
        SceneConfig(render_mesh_faces=2)
    with pytest.raises(ValueError, match="render_samples"):
        SceneConfig(render_samples=3)
    with pytest.raises(ValueError, match="max_faces"):
        decimate_visual_meshes(compose(SceneConfig(render_mesh_faces=0)), 1)
