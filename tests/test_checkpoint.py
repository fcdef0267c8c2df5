"""Checkpoints: exact round trip, atomic replacement, and clear refusals of bad files."""

import json
import os
import pathlib
import pickle
import shutil
import signal

import pytest
import torch
from safetensors.torch import load_file, save_file

from simdist_planner.data.synthetic import synthetic_windows
from simdist_planner.model import checkpoint
from simdist_planner.model.checkpoint import (
    CheckpointError,
    load_checkpoint,
    read_metrics,
    recover_dir,
    save_checkpoint,
)
from simdist_planner.model.config import AttentionConfig, go2_config
from simdist_planner.model.world_model import WorldModel
from simdist_planner.training.train_state import load_train_state, save_train_state


def tiny_cfg(**kw):
    att = AttentionConfig(1, 2)
    base = dict(
        latent_dim=16, history=2, horizon=3, dynamics=att, reward=att, value=att, policy=att
    )
    return go2_config(**{**base, **kw})


@pytest.fixture
def saved(tmp_path):
    cfg = tiny_cfg()
    model = WorldModel(cfg)
    w = synthetic_windows(cfg, 4)
    model.scaler.fit({k: w[k] for k in model.scaler.dims})
    path = save_checkpoint(model, tmp_path / "ckpt", metrics={"step": 7, "loss": 0.5})
    return model, path, w


def test_round_trip_is_exact(saved):
    model, path, w = saved
    assert sorted(p.name for p in path.iterdir()) == [
        "config.json",
        "metrics.json",
        "model.safetensors",
        "scaler.json",
    ]
    loaded = load_checkpoint(path)
    assert loaded.config == model.config
    a, b = model.state_dict(), loaded.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert read_metrics(path) == {"step": 7, "loss": 0.5}
    model.eval()
    obs = {k: w[k][:, 2] for k in ("proprio", "height_map")}
    assert torch.equal(model.encode(obs), loaded.encode(obs))


def test_save_replaces_atomically_and_leaves_no_temporaries(saved, tmp_path):
    model, path, _ = saved
    with torch.no_grad():
        model.f.decoder.layers[0].mlp.net[0].weight.add_(1.0)
    save_checkpoint(model, path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    loaded = load_checkpoint(path)
    assert torch.equal(
        loaded.f.decoder.layers[0].mlp.net[0].weight, model.f.decoder.layers[0].mlp.net[0].weight
    )


def test_a_save_killed_between_its_renames_loses_nothing_but_itself(saved, tmp_path, monkeypatch):
    """Without RENAME_EXCHANGE, replace_dir renames the old version away, then the new one in;
    a kill between the two leaves no checkpoint directory. Loading puts the previous version
    back."""
    model, path, _ = saved
    before = load_checkpoint(path).state_dict()
    monkeypatch.setattr(checkpoint, "_renameat2", None)
    real_rename = pathlib.Path.rename

    def killed_after_first(self, target):
        if ".tmp-" in self.name:  # the second rename: the process dies here
            raise KeyboardInterrupt
        return real_rename(self, target)

    monkeypatch.setattr(pathlib.Path, "rename", killed_after_first)
    with torch.no_grad():
        model.f.decoder.layers[0].mlp.net[0].weight.add_(1.0)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(model, path)
    monkeypatch.undo()
    assert not path.exists() and any(p.name.startswith(".ckpt.old-") for p in tmp_path.iterdir())
    assert recover_dir(tmp_path / "missing") is None  # nothing to recover
    loaded = load_checkpoint(path)  # recovers the previous version
    after = loaded.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert recover_dir(path) is None  # present: nothing to do


def test_truncated_weights_are_refused(saved):
    _, path, _ = saved
    file = path / "model.safetensors"
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"model\.safetensors: corrupt or truncated"):
        load_checkpoint(path)


def test_flipped_bytes_are_refused(saved):
    _, path, _ = saved
    file = path / "model.safetensors"
    data = bytearray(file.read_bytes())
    data[-10] ^= 0xFF
    file.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"model\.safetensors: SHA-256 does not match"):
        load_checkpoint(path)


def test_wrong_shape_tensor_is_refused(saved):
    _, path, _ = saved
    file = path / "model.safetensors"
    tensors = load_file(str(file))
    tensors["f.action_embed.proj.weight"] = torch.zeros(16, 13)
    save_file(tensors, str(file))
    with pytest.raises(
        CheckpointError,
        match=r"f\.action_embed\.proj\.weight \(16, 13\) \(config needs \(16, 12\)\)",
    ):
        load_checkpoint(path)


def test_missing_tensor_is_refused(saved):
    _, path, _ = saved
    file = path / "model.safetensors"
    tensors = load_file(str(file))
    del tensors["value_head.out.bias"]
    save_file(tensors, str(file))
    with pytest.raises(CheckpointError, match=r"missing \['value_head\.out\.bias'\]"):
        load_checkpoint(path)


def test_config_mismatch_is_refused(saved):
    model, path, _ = saved
    with pytest.raises(
        CheckpointError, match=r"config mismatch: latent_dim: checkpoint 16 != expected 32"
    ):
        load_checkpoint(path, expect=tiny_cfg(latent_dim=32))
    # a config.json edited to another architecture no longer matches the stored tensors
    cfg_file = path / "config.json"
    data = json.loads(cfg_file.read_text())
    data["config"]["latent_dim"] = 32
    cfg_file.write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match="tensor shapes do not match the config"):
        load_checkpoint(path)
    data["config"]["flavour"] = "x"
    cfg_file.write_text(json.dumps(data))
    with pytest.raises(
        CheckpointError,
        match=r"config\.json: invalid world-model config: .*unknown keys \['flavour'\]",
    ):
        load_checkpoint(path)
    data["format_version"] = 0
    cfg_file.write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match="checkpoint format_version 0"):
        load_checkpoint(path)


def test_bad_scaler_and_missing_files_are_refused(saved, tmp_path):
    _, path, _ = saved
    (path / "scaler.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="scaler.json"):
        load_checkpoint(path)
    (path / "metrics.json").unlink()
    with pytest.raises(CheckpointError, match=r"metrics\.json: missing"):
        read_metrics(path)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "nowhere")


def test_loading_never_unpickles(saved, monkeypatch):
    _, path, _ = saved

    def forbidden(*args, **kwargs):
        raise AssertionError("a checkpoint load tried to unpickle")

    monkeypatch.setattr(pickle, "load", forbidden)
    monkeypatch.setattr(pickle, "loads", forbidden)
    monkeypatch.setattr(torch, "load", forbidden)
    load_checkpoint(path)


def test_exchange_paths_swaps_two_directories_in_one_step(tmp_path):
    """On this Linux filesystem renameat2(RENAME_EXCHANGE) is there; it swaps the two names."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "from_a").write_text("a")
    (b / "from_b").write_text("b")
    assert checkpoint.exchange_paths(a, b)
    assert [p.name for p in a.iterdir()] == ["from_b"]
    assert [p.name for p in b.iterdir()] == ["from_a"]
    with pytest.raises(FileNotFoundError):
        checkpoint.exchange_paths(a, tmp_path / "missing")


def _trained(cfg, seed: int):
    """A model and an Adam optimizer with moments (one step on a fixed gradient)."""
    torch.manual_seed(seed)
    model = WorldModel(cfg)
    w = synthetic_windows(cfg, 4)
    model.scaler.fit({k: w[k] for k in model.scaler.dims})
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for p in model.parameters():
        p.grad = torch.full_like(p, 0.1 * (seed + 1))
    optimizer.step()
    return model, optimizer


def _killed_save(out, model, optimizer, step, at: str, exchange: bool) -> int:
    """Save a train state in a forked child process that SIGKILLs itself at point `at` of
    replace_dir of `out/train_state`; returns the child's wait status."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            if not exchange:
                checkpoint._renameat2 = None

            def die(name, final):
                if name == at and final.name == "train_state":
                    os.kill(os.getpid(), signal.SIGKILL)

            checkpoint._at_step = die
            save_train_state(out, model, optimizer, step, {})
        finally:
            os._exit(3)  # only reached when the kill point never came
    _, status = os.waitpid(pid, 0)
    return status


@pytest.mark.parametrize(
    "exchange,steps",
    [
        (True, checkpoint.REPLACE_STEPS_EXCHANGE),
        (False, checkpoint.REPLACE_STEPS_RENAMES),
    ],
    ids=["rename_exchange", "two_renames"],
)
def test_a_train_state_save_killed_at_any_step_leaves_the_old_or_the_new_state(
    tmp_path, exchange, steps
):
    """A process SIGKILLed at each point of replacing train_state: what a resume reads (after
    the training loop's recover_dir) is the complete previous state (killed before the swap)
    or the complete new one (killed after it), never none; leftovers are removed."""
    cfg = tiny_cfg()
    old_model, old_opt = _trained(cfg, 0)
    new_model, new_opt = _trained(cfg, 1)
    base = tmp_path / "base"
    save_train_state(base, old_model, old_opt, 1, {})
    first_new = steps.index("exchanged" if exchange else "new_in")
    for i, at in enumerate(steps):
        out = tmp_path / at
        shutil.copytree(base, out)
        status = _killed_save(out, new_model, new_opt, 2, at, exchange)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (at, status)
        checkpoint.recover_dir(out / "train_state", remove_leftovers=True)
        assert sorted(p.name for p in out.iterdir()) == ["train_state"], at
        model, opt = _trained(cfg, 2)
        step = load_train_state(out, model, opt)
        want_step, want = (2, new_model) if i >= first_new else (1, old_model)
        assert step == want_step, at
        a, b = model.state_dict(), want.state_dict()
        assert all(torch.equal(a[k], b[k]) for k in a), at
        want_moments = (new_opt if i >= first_new else old_opt).state_dict()["state"]
        got_moments = opt.state_dict()["state"]
        assert all(
            torch.equal(got_moments[k]["exp_avg"], want_moments[k]["exp_avg"]) for k in got_moments
        ), at
