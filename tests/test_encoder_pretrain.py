"""The encoder stage of pretraining: the image backbone learns to read the task state from the
cameras before Eq. 2, may stay frozen afterwards, and is not run again when a run resumes."""

import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from simdist_planner.data.reader import ShardedDataset
from simdist_planner.data.schema import EpisodeRecord, StepLayout, shard_name
from simdist_planner.data.writer import ShardWriter
from simdist_planner.model.checkpoint import load_checkpoint
from simdist_planner.model.losses import near_field_slices, state_targets
from simdist_planner.model.world_model import WorldModel
from simdist_planner.training.config import PretrainConfig
from simdist_planner.training.encoder_stage import pretrain_image_backbone
from simdist_planner.training.loop import pretrain
from simdist_planner.training.sampler import WindowSource
from simdist_planner.training.scaler_fit import fit_scaler

SIZE = 16


def _blob_shard(path, episodes, seed, shard=0):
    """Episodes whose camera shows one bright 3 x 3 blob at a random place per row; the task
    state `blob` is that place in metres (2 cm across the view), so only the image tells it."""
    layout = StepLayout(
        proprio_terms=(("joint_pos", 3), ("gripper", 1)),
        action_dim=2,
        cameras=("wrist",),
        image_shape=(SIZE, SIZE),
        state_terms=(("blob", 2),),
    )
    rng = np.random.default_rng(seed)
    attrs = {
        "task": "",
        "config": json.dumps({"robot": {"obs_noise": {"joint_pos": 0.01, "gripper": 0.0}}}),
    }
    with ShardWriter(path / shard_name(shard), layout, attrs) as w:
        for ep in range(episodes):
            rows = 20
            where = rng.integers(1, SIZE - 1, (rows, 2))
            images = np.full((rows, SIZE, SIZE, 3), 30, np.uint8)
            for k, (i, j) in enumerate(where):
                images[k, i - 1 : i + 2, j - 1 : j + 2] = 230
            steps = {
                "proprio": rng.normal(size=(rows, 4)).astype(np.float32),
                "images/wrist": images,
                "action": rng.normal(size=(rows, 2)).astype(np.float32),
                "reward": rng.normal(size=rows).astype(np.float32),
                "value": rng.normal(size=rows).astype(np.float32),
                "expert": np.ones(rows, np.uint8),
                "noised": np.zeros(rows, np.uint8),
                "state": (where * 0.02 / SIZE).astype(np.float32),
            }
            w.append(
                EpisodeRecord(
                    id=shard * 1000 + ep,
                    steps=steps,
                    policy=0,
                    seed=ep,
                    noise_scale=np.zeros(2),
                    never_noised=False,
                    success=False,
                    terminated=False,
                    truncated=True,
                )
            )


def _cfg(tmp_path, **kw) -> PretrainConfig:
    base = dict(
        model="ur5e_small",
        data=(str(tmp_path / "train"),),
        steps=4,
        batch_size=16,
        warmup_steps=1,
        checkpoint_every=100,
        log_every=10,
        workers=0,
        encoder_steps=150,
        encoder_learning_rate=3e-3,
        image_shift=0,
        model_overrides={
            "latent_dim": 16,
            "history": 2,
            "horizon": 3,
            "image": {"small_cnn_features": 32},
        },
    )
    return PretrainConfig.from_flat({**base, **kw})


@pytest.fixture
def data(tmp_path):
    _blob_shard(tmp_path / "train", episodes=10, seed=0)
    _blob_shard(tmp_path / "held_out", episodes=3, seed=1)
    return tmp_path


def _reader_error(reader, model, path, near):
    """The reader's RMS error on every row of the shards in `path`, in units of the targets."""

    rows = ShardedDataset(path)
    ep = [rows.episode(i) for i in range(rows.num_episodes)]
    images = torch.from_numpy(np.concatenate([e["images/wrist"] for e in ep])).permute(0, 3, 1, 2)[
        :, None
    ]
    proprio = torch.from_numpy(np.concatenate([e["proprio"] for e in ep]))
    state = torch.from_numpy(np.concatenate([e["state"] for e in ep]))
    with torch.no_grad():
        pred = reader(images, model.scaler.normalize("proprio", proprio))
    return float(((pred - state_targets(model.scaler, state, near)) ** 2).mean().sqrt())


def test_the_encoder_stage_teaches_the_backbone_to_read_the_state_from_the_image(data):
    cfg = _cfg(data, encoder_near_field={"blob": 0.005})
    source = WindowSource(cfg, 0, 1)
    model = WorldModel(source.model_config)
    fit_scaler(model, cfg, source)
    reader, losses = pretrain_image_backbone(
        model, source, cfg, torch.device("cpu"), progress=False
    )
    assert len(losses) == 15 and losses[-1] < 0.3 * losses[0]
    # held-out rows (other blobs): the proprio is noise, so only a backbone that reads the image
    # can predict the state; the same reader with the backbone as it started cannot
    near = near_field_slices(
        source.windows.dataset.layout, cfg.encoder_stage.near_field, "encoder_near_field"
    )
    trained = _reader_error(reader, model, data / "held_out", near)
    fresh = WorldModel(source.model_config)
    fresh.scaler.load_state_dict(model.scaler.state_dict())
    reader.images = fresh.encoder.images
    untrained = _reader_error(reader, model, data / "held_out", near)
    assert trained < 0.5 and untrained > 2 * trained


def test_a_frozen_backbone_keeps_the_stage_s_weights_and_a_resumed_run_skips_the_stage(data):
    def backbone(run):
        m = load_checkpoint(run)
        return {k: v for k, v in m.state_dict().items() if k.startswith("encoder.images.backbone.")}

    cfg = _cfg(data, encoder_steps=20, freeze_image_backbone=True)
    after_stage = backbone(
        pretrain(dataclasses.replace(cfg, steps=1), data / "one", progress=False)
    )
    frozen = pretrain(cfg, data / "frozen", progress=False)
    assert after_stage and all(torch.equal(after_stage[k], v) for k, v in backbone(frozen).items())
    one = load_checkpoint(data / "one" / "model").state_dict()
    assert not torch.equal(
        one["encoder.latent.net.0.weight"],
        load_checkpoint(frozen).state_dict()["encoder.latent.net.0.weight"],
    )  # the rest of E trains
    trained = backbone(
        pretrain(cfg.replace(freeze_image_backbone=False), data / "free", progress=False)
    )
    assert not all(torch.equal(after_stage[k], v) for k, v in trained.items())
    # a run stopped after its first step resumes without training the backbone again
    pretrain(dataclasses.replace(cfg, time_limit_s=1e-9), data / "stopped", progress=False)
    resumed = load_checkpoint(pretrain(cfg, data / "stopped", progress=False)).state_dict()
    straight = load_checkpoint(frozen).state_dict()
    assert all(torch.equal(resumed[k], v) for k, v in straight.items())


def test_encoder_stage_and_near_field_settings_are_checked(data):
    with pytest.raises(ValueError, match="freeze_image_backbone keeps a trained backbone"):
        _cfg(data, encoder_steps=0, freeze_image_backbone=True)
    with pytest.raises(
        ValueError, match="encoder_near_field must map state terms to positive scales"
    ):
        _cfg(data, encoder_near_field={"blob": 0})
    with pytest.raises(ValueError, match="encoder_steps need a dataset"):
        _cfg(data, data=(), synthetic=True)
    with pytest.raises(
        ValueError, match=r"encoder_near_field names \['hole'\]; .* terms \['blob'\]"
    ):
        pretrain(_cfg(data, encoder_near_field={"hole": 0.005}), data / "bad", progress=False)
    with pytest.raises(
        ValueError, match="state_near_field must map state terms to positive scales"
    ):
        _cfg(data, state_near_field={"blob": -1.0})
    with pytest.raises(ValueError, match=r"state_near_field names \['hole'\]; .* terms \['blob'\]"):
        pretrain(
            _cfg(data, encoder_steps=0, state_near_field={"hole": 0.005}),
            data / "bad_z",
            progress=False,
        )
    with pytest.raises(ValueError, match="need a dataset with camera images and the task state"):
        pretrain(
            _cfg(
                data,
                model_overrides={
                    "latent_dim": 16,
                    "history": 2,
                    "horizon": 3,
                    "loss": {"state": 0.0},
                },
            ),
            data / "stateless",
            progress=False,
        )


@pytest.mark.slow  # two ranks; test_pretrain.py checks DDP ranks in make test
def test_two_ranks_with_a_frozen_backbone_end_with_identical_weights(data):
    # each rank trains the stage on its own shard; DDP starts every rank from rank 0's weights,
    # and a frozen backbone is never all-reduced, so this holds only if that start covers it
    _blob_shard(data / "two", episodes=4, seed=2, shard=0)
    _blob_shard(data / "two", episodes=4, seed=3, shard=1)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "simdist_planner.cli.pretrain",
        "--model",
        "ur5e_small",
        "--data",
        str(data / "two"),
        "--model-overrides",
        json.dumps({"latent_dim": 16, "history": 2, "horizon": 3}),
        "--steps",
        "2",
        "--batch-size",
        "8",
        "--warmup-steps",
        "1",
        "--workers",
        "0",
        "--encoder-steps",
        "10",
        "--encoder-near-field",
        '{"blob": 0.005}',
        "--freeze-image-backbone",
        "true",
        "--out",
        str(data / "ddp"),
        "--no-progress",
    ]
    res = subprocess.run(
        cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert res.returncode == 0, res.stderr[-3000:]
    metrics = json.loads((data / "ddp" / "model" / "metrics.json").read_text())
    a, b = metrics["rank_weights_sha256"]
    assert metrics["world_size"] == 2 and a == b
    assert "pretrain: encoder stage, 10 steps" in res.stdout


def test_state_near_field_enters_the_state_term_of_pretraining(data):
    """The same first step with and without `state_near_field`: only the state term changes
    (the near-field copies of the blob's place join it), every other term is the same."""

    def first_step(name, **kw):
        run = pretrain(
            _cfg(data, encoder_steps=0, steps=1, log_every=1, **kw), data / name, progress=False
        )
        return json.loads((run / "metrics.json").read_text())

    plain, near = first_step("plain"), first_step("near", state_near_field={"blob": 0.005})
    for term in ("latent", "reward", "value", "action"):
        assert near[f"loss/{term}"] == pytest.approx(plain[f"loss/{term}"], rel=1e-6)
    assert abs(near["loss/state"] - plain["loss/state"]) > 1e-3 * plain["loss/state"]
