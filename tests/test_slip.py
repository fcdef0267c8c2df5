"""The Go2's feet from proprio, and `simdist-slip` on an experiment's D_real."""

import dataclasses
import json

import mujoco
import numpy as np
import pytest
import torch

from robot_drivers.go2.kinematics import Go2Kinematics
from robot_drivers.go2.observation import PROPRIO_SLICES
from robot_drivers.registry import expert_ladder, make_task
from simdist_adapter.experiment import Experiment
from simdist_adapter.slip import SLIP_SPEED, main, stance_slip
from simdist_planner.model.checkpoint import save_checkpoint
from test_adapter import small_model
from test_experiment import config


@pytest.fixture(scope="module")
def kin():
    return Go2Kinematics()


def test_feet_from_proprio_are_the_simulators_feet(kin):
    """Along the expert's walk on the slippery stand-in, forward kinematics of the proprio
    vector gives each foot's position and world velocity in the base frame, as MuJoCo has them."""
    task = make_task("slippery_slope", "real", speed=0.3, panel_friction=0.12)
    expert = expert_ladder(task)[0]
    obs = task.reset(0)
    expert.reset(0)
    b = task.backend
    res = np.zeros(6)
    moving = 0.0
    for _ in range(60):
        obs = task.step(expert.act(obs)).obs
        pos, vel = kin.feet(obs.proprio)
        rot = b.data.xmat[b._base].reshape(3, 3)
        for k, geom in enumerate(b._foot_geoms):
            mujoco.mj_objectVelocity(b.model, b.data, mujoco.mjtObj.mjOBJ_GEOM, geom, res, 0)
            np.testing.assert_allclose(vel[k], rot.T @ res[3:], atol=1e-5)
            rel = b.data.geom_xpos[geom] - b.data.xpos[b._base]
            np.testing.assert_allclose(pos[k], rot.T @ rel, atol=1e-5)
        moving = max(moving, float(np.abs(vel).max()))
    assert moving > 0.3  # the feet swing: the check compared motion, not rest
    task.close()


def test_a_stance_foot_slips_with_the_base_unless_the_legs_move_it_back(kin):
    proprio = np.zeros(35)
    proprio[PROPRIO_SLICES["base_lin_vel"]] = (0.3, 0.0, 0.0)  # base slides, joints still
    stance, speed = stance_slip(kin, proprio[None])
    assert stance.shape == (1,) and speed[0] == pytest.approx(0.3, abs=1e-9)
    # batched input keeps its leading shape, and the given stance foot is the one read
    both = np.stack([proprio, np.zeros(35)])[None]
    stance, speed = stance_slip(kin, both, np.array([[1, 1]]))
    assert speed.shape == (1, 2) and speed[0, 1] == 0.0 and speed[0, 0] > SLIP_SPEED


@pytest.mark.timeout(300)
def test_slip_reads_every_model_on_the_same_held_out_steps(tmp_path, capsys):
    torch.manual_seed(0)
    checkpoint = save_checkpoint(small_model(), tmp_path / "pretrained")
    cfg = dataclasses.replace(
        config(tmp_path, checkpoint, 1, "exp"), methods=("simdist",), max_steps=40
    )
    Experiment(cfg).run()
    d_real = tmp_path / "exp" / "simdist" / "d_real"
    adapted = tmp_path / "exp" / "simdist" / "registry" / "deployed"
    out = tmp_path / "slip.json"
    argv = ["--d-real", str(d_real), "--out", str(out)]  # the experiment's gate set
    argv += ["--checkpoint", f"pretrained={checkpoint}", "--checkpoint", f"again={checkpoint}"]
    main([*argv, "--checkpoint", f"adapted={adapted}", "--plot", str(tmp_path / "slip.png")])
    rows = {r["model"]: r for r in json.loads(out.read_text())["rows"]}
    assert list(rows) == ["oracle", "pretrained", "again", "adapted"]
    assert rows["oracle"]["heldout_latent_loss"] is None
    assert len({r["real_slip"] for r in rows.values()}) == 1  # one set of real steps
    assert len({r["slipping_steps"] for r in rows.values()}) == 1
    same = {k: v for k, v in rows["again"].items() if k != "model"}
    assert same == {k: v for k, v in rows["pretrained"].items() if k != "model"}
    assert rows["adapted"] != {**rows["pretrained"], "model": "adapted"}  # f changed, so did this
    # the gate deployed the candidate for its lower held-out loss; the table reads the same figure
    history = json.loads((adapted.parent / "history.json").read_text())
    assert rows["adapted"]["heldout_latent_loss"] < rows["pretrained"]["heldout_latent_loss"]
    assert len(history) == 2
    assert (tmp_path / "slip.png").stat().st_size > 0 and "oracle" in capsys.readouterr().out
