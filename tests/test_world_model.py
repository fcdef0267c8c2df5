"""World model: official sizes, API shapes and units, causality of f, one-pass chunking, configs."""

import json
import subprocess
import sys

import pytest
import torch
import torchvision
from safetensors.torch import save_file

from simdist_planner.data.synthetic import synthetic_windows
from simdist_planner.model.checkpoint import load_checkpoint, save_checkpoint
from simdist_planner.model.config import (
    AttentionConfig,
    ImageEncoderConfig,
    WorldModelConfig,
    go2_config,
    ur5e_config,
    ur5e_small_config,
)
from simdist_planner.model.world_model import WorldModel

OFFICIAL_GO2_PARAMS = 668_494
OFFICIAL_GO2_DYNAMICS = 133_506


def tiny_go2(**kw) -> WorldModelConfig:
    small = AttentionConfig(2, 2)
    base = dict(
        latent_dim=16,
        history=3,
        horizon=6,
        dynamics=small,
        reward=AttentionConfig(1, 2),
        value=AttentionConfig(1, 2),
        policy=small,
    )
    base.update(kw)
    return go2_config(**base)


def current_obs(window: dict, h: int) -> dict:
    return {
        k: window[k][:, h] for k in ("proprio", "height_map", "images", "command") if k in window
    }


def test_go2_parameter_count_matches_official():
    model = WorldModel(go2_config())
    counts = model.parameter_counts()
    scaler = sum(b.numel() for b in model.scaler.buffers())
    total = counts["total"] + scaler  # the official count includes the scaler's mean / std
    transformer = sum(p.numel() for p in model.f.decoder.parameters())
    print(
        f"\nGo2 world model: {counts['total']:,} parameters + {scaler} scaler = {total:,} "
        f"(official {OFFICIAL_GO2_PARAMS:,}); dynamics transformer {transformer:,} "
        f"(official {OFFICIAL_GO2_DYNAMICS:,}), f with action embedding {counts['dynamics']:,}"
    )
    assert abs(total - OFFICIAL_GO2_PARAMS) / OFFICIAL_GO2_PARAMS < 0.05
    assert abs(transformer - OFFICIAL_GO2_DYNAMICS) / OFFICIAL_GO2_DYNAMICS < 0.05


def test_ur5e_official_config_uses_resnet18_on_three_cameras():
    cfg = ur5e_config()
    assert cfg.image.backbone == "resnet18" and (cfg.image.height, cfg.image.width) == (224, 224)
    assert cfg.image.cameras == ("wrist", "overhead", "side")
    assert (cfg.history, cfg.horizon, cfg.action_dim, cfg.latent_dim) == (5, 5, 7, 64)
    assert (cfg.dynamics.layers, cfg.dynamics.heads, cfg.policy.layers, cfg.policy.heads) == (
        3,
        4,
        4,
        8,
    )
    model = WorldModel(cfg)
    assert model.encoder.images.out_features == 3 * 512
    small = WorldModel(ur5e_small_config())
    assert small.parameter_counts()["total"] < model.parameter_counts()["total"] / 5


@pytest.mark.parametrize(
    "make",
    [tiny_go2]
    + [
        lambda backbone=b, **kw: ur5e_small_config(
            latent_dim=16, image=ImageEncoderConfig(("a", "b"), 16, 16, backbone=backbone), **kw
        )
        for b in ("small_cnn",)
    ],
)
def test_api_shapes(make):
    cfg = make()
    model = WorldModel(cfg).eval()
    h, t = cfg.history, cfg.horizon
    w = synthetic_windows(cfg, 3)
    z = model.encode(current_obs(w, h))
    hist = model.encode_history(w["proprio"][:, :h], w["actions"][:, :h])
    assert z.shape == (3, 16) and hist.shape == (3, 2 * h, 16)
    lat = model.dynamics(z, w["actions"][:, h:], hist)
    assert lat.shape == (3, t, 16)
    latents = torch.cat((z[:, None], lat), 1)
    cmd = w["command"][:, h] if "command" in w else None
    assert model.reward(latents, w["actions"][:, h:], cmd).shape == (3, t)
    assert model.value(latents, cmd).shape == (3, t)
    assert model.policy(z, hist, cmd, w["proprio"][:, h]).shape == (3, t, cfg.action_dim)
    # a shorter history and horizon work too (first steps of an episode, short plans)
    hist2 = model.encode_history(w["proprio"][:, h - 1 : h], w["actions"][:, h - 1 : h])
    assert model.dynamics(z, w["actions"][:, h : h + 2], hist2).shape == (3, 2, 16)


def test_outputs_are_in_raw_units():
    cfg = tiny_go2()
    model = WorldModel(cfg).eval()
    w = synthetic_windows(cfg, 2)
    h = cfg.history
    z = model.encode(current_obs(w, h))
    hist = model.encode_history(w["proprio"][:, :h], w["actions"][:, :h])
    latents = torch.cat((z[:, None], model.dynamics(z, w["actions"][:, h:], hist)), 1)
    cmd = w["command"][:, h]
    r0, v0, a0 = (
        model.reward(latents, w["actions"][:, h:], cmd),
        model.value(latents, cmd),
        model.policy(z, hist, cmd),
    )
    with torch.no_grad():
        model.scaler.rewards_mean.fill_(5.0), model.scaler.rewards_std.fill_(2.0)
        model.scaler.values_mean.fill_(-1.0), model.scaler.values_std.fill_(3.0)
        model.scaler.actions_mean.fill_(0.5), model.scaler.actions_std.fill_(0.1)
    torch.testing.assert_close(model.value(latents, cmd), 3.0 * v0 - 1.0)
    torch.testing.assert_close(model.policy(z, hist, cmd), 0.1 * a0 + 0.5)
    # reward also sees the actions, now normalised differently: just check it moved to raw units
    assert not torch.allclose(model.reward(latents, w["actions"][:, h:], cmd), r0)


@pytest.mark.parametrize("kind", ["chunked", "autoregressive"])
def test_dynamics_is_causal_in_actions(kind):
    cfg = tiny_go2(dynamics_kind=kind)
    model = WorldModel(cfg).eval()
    w = synthetic_windows(cfg, 2)
    h, t = cfg.history, cfg.horizon
    z = model.encode(current_obs(w, h))
    hist = model.encode_history(w["proprio"][:, :h], w["actions"][:, :h])
    actions = w["actions"][:, h:]
    base = model.dynamics(z, actions, hist)
    for k in (0, 2, t - 1):
        changed = actions.clone()
        changed[:, k] += 3.0
        out = model.dynamics(z, changed, hist)
        # output i is z^_{t+i+1}: unchanged for i < k, changed from i = k on
        torch.testing.assert_close(out[:, :k], base[:, :k], atol=1e-5, rtol=0)
        assert (out[:, k:] - base[:, k:]).abs().amax(dim=-1).min() > 1e-4


def test_policy_proprio_skip_starts_as_pi_and_is_linear_in_the_proprio():
    """The proprio skip is zero-initialised, so the chunk starts as without it; then pi's
    chunk moves linearly with o^p_t (the rest of pi reads z and the history), and the path is
    part of pi (frozen with it in adaptation)."""
    module = "proprio_skip"
    plain, cfg = tiny_go2(), tiny_go2(policy_proprio_skip=True)
    model = WorldModel(cfg).eval()
    base = WorldModel(plain).eval()
    base.load_state_dict({k: v for k, v in model.state_dict().items() if module not in k})
    assert model.part_of(f"policy_head.{module}.weight") == "policy"
    w = synthetic_windows(cfg, 2)
    h = cfg.history
    obs, cmd = current_obs(w, h), w["command"][:, h]
    z = model.encode(obs)
    hist = model.encode_history(w["proprio"][:, :h], w["actions"][:, :h])
    torch.testing.assert_close(
        model.policy(z, hist, cmd, obs["proprio"]), base.policy(z, hist, cmd)
    )
    with pytest.raises(ValueError, match="reads the proprio"):
        model.policy(z, hist, cmd)
    with torch.no_grad():
        getattr(model.policy_head, module).weight.normal_()
    a0, a1, a2 = (model.policy(z, hist, cmd, obs["proprio"] + d) for d in (0.0, 1.0, 2.0))
    assert not torch.allclose(a1, a0)
    torch.testing.assert_close(a2 - a1, a1 - a0, atol=1e-4, rtol=1e-4)  # linear in o^p_t
    torch.testing.assert_close(
        model(w)["actions"],
        model.scaler.normalize(
            "actions", model.policy(z, hist, w["command"][:, h:], obs["proprio"])
        ),
        atol=1e-5,
        rtol=1e-5,
    )  # training = inference


@pytest.mark.parametrize("kind,calls", [("chunked", 1), ("autoregressive", 6)])
def test_chunked_dynamics_is_one_forward_pass(kind, calls):
    cfg = tiny_go2(dynamics_kind=kind)
    model = WorldModel(cfg).eval()
    w = synthetic_windows(cfg, 4)
    h = cfg.history
    count = {"f": 0, "decoder": 0}
    model.f.register_forward_hook(lambda *a: count.__setitem__("f", count["f"] + 1))
    model.f.decoder.register_forward_hook(
        lambda *a: count.__setitem__("decoder", count["decoder"] + 1)
    )
    z = model.encode(current_obs(w, h))
    hist = model.encode_history(w["proprio"][:, :h], w["actions"][:, :h])
    out = model.dynamics(z, w["actions"][:, h:], hist)
    assert out.shape[1] == cfg.horizon == 6
    assert count == {"f": 1, "decoder": calls}


def test_bad_inputs_raise_clear_errors():
    cfg = tiny_go2()
    model = WorldModel(cfg).eval()
    w = synthetic_windows(cfg, 2)
    obs = current_obs(w, cfg.history)
    with pytest.raises(ValueError, match=r"proprio has shape \(2, 34\), expected \(\.\.\., 35\)"):
        model.encode({**obs, "proprio": obs["proprio"][:, :34]})
    with pytest.raises(ValueError, match="needs obs\\['height_map'\\]"):
        model.encode({"proprio": obs["proprio"]})
    z = model.encode(obs)
    hist = model.encode_history(w["proprio"][:, :3], w["actions"][:, :3])
    with pytest.raises(ValueError, match="needs the command"):
        model.policy(z, hist)
    with pytest.raises(ValueError, match="actions has shape"):
        model.dynamics(z, w["actions"][:, :, :5], hist)
    with pytest.raises(ValueError, match="longer than the model's horizon"):
        model.dynamics(z, torch.zeros(2, 7, 12), hist)
    with pytest.raises(ValueError, match="longer than the model's H"):
        model.encode_history(torch.zeros(2, 4, 35), torch.zeros(2, 4, 12))


def test_config_round_trip_and_validation():
    for cfg in (go2_config(), ur5e_config(), ur5e_small_config(dynamics_kind="autoregressive")):
        assert WorldModelConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    data = go2_config().to_dict()
    legacy = {
        k: v for k, v in data.items() if k not in ("normalize_latent", "state_dim")
    }  # written before
    legacy["loss"] = {k: v for k, v in data["loss"].items() if k != "state"}  # the keys existed
    old = WorldModelConfig.from_dict(legacy)
    assert old.normalize_latent is False and old.state_dim == 0 and old.loss.state == 0.0
    assert "state" not in legacy["loss"]  # the caller's dict is left as it was
    assert WorldModel(old).state_head is None and WorldModel(old).parameter_counts()["state"] == 0
    with pytest.raises(ValueError, match="unknown keys \\['colour'\\]"):
        WorldModelConfig.from_dict({**data, "colour": 1})
    with pytest.raises(ValueError, match="format_version"):
        WorldModelConfig.from_dict({**data, "format_version": 99})
    with pytest.raises(ValueError, match="latent_dim: expected an integer"):
        WorldModelConfig.from_dict({**data, "latent_dim": "64"})
    with pytest.raises(ValueError, match="not divisible by dynamics.heads"):
        go2_config(latent_dim=60)
    with pytest.raises(ValueError, match="dynamics_kind must be one of"):
        go2_config(dynamics_kind="diffusion")


def test_checkpoints_of_removed_options_load_only_as_without_them(tmp_path):
    """Configs written while `policy_sees_history` and `policy_proprio_gain` existed load when
    they hold the value that meant "as without them"; one that needs either is refused by name."""
    data = go2_config().to_dict()
    old = {**data, "policy_sees_history": True, "policy_proprio_gain": False}
    assert WorldModelConfig.from_dict(old) == go2_config()
    assert "policy_proprio_gain" in old  # the caller's dict is left as it was
    for key, value in (("policy_sees_history", False), ("policy_proprio_gain", True)):
        with pytest.raises(ValueError, match=f"{key}={value}, an option this version removed"):
            WorldModelConfig.from_dict({**data, key: value})
    # a checkpoint on disk, as an earlier version wrote it
    cfg = tiny_go2()
    save_checkpoint(WorldModel(cfg), tmp_path / "ck")
    config_file = tmp_path / "ck" / "config.json"
    written = json.loads(config_file.read_text())
    written["config"].update(policy_sees_history=True, policy_proprio_gain=False)
    config_file.write_text(json.dumps(written))
    assert load_checkpoint(tmp_path / "ck").config == cfg
    written["config"]["policy_proprio_gain"] = True
    config_file.write_text(json.dumps(written))
    with pytest.raises(
        ValueError, match="policy_proprio_gain=True, an option this version removed"
    ):
        load_checkpoint(tmp_path / "ck")


def test_resnet_weights_load_from_local_file(tmp_path):
    ref = torchvision.models.resnet18(weights=None)
    file = tmp_path / "resnet18.safetensors"
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(file))
    image = ImageEncoderConfig(("wrist",), 32, 32, weights_path=str(file))
    model = WorldModel(ur5e_config(image=image))
    backbone = model.encoder.images.backbone
    torch.testing.assert_close(backbone.conv1.weight, ref.conv1.weight, atol=0, rtol=0)
    torch.testing.assert_close(backbone.layer4[1].bn2.running_var, ref.layer4[1].bn2.running_var)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        WorldModel(
            ur5e_config(
                image=ImageEncoderConfig(("wrist",), 32, 32, weights_path=str(tmp_path / "no"))
            )
        )


def test_torchvision_is_imported_only_by_a_model_with_a_resnet():
    """torchvision's import loads torch._dynamo; the planner and adapter nodes of a model without
    a ResNet (the Go2's, a small-CNN UR5e) start without it."""
    code = (
        "import sys; from simdist_planner.model.world_model import WorldModel;"
        "from simdist_planner.model.config import ImageEncoderConfig, go2_config, ur5e_config;"
        "import simdist_planner.ros.planner_node, simdist_adapter.adapter_node;"
        "WorldModel(go2_config(latent_dim=16));"
        "WorldModel(ur5e_config(image=ImageEncoderConfig(('wrist',), 32, 32, 'small_cnn')));"
        "assert 'torchvision' not in sys.modules, 'torchvision imported without a ResNet';"
        "WorldModel(ur5e_config(image=ImageEncoderConfig(('wrist',), 32, 32)));"
        "assert 'torchvision' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def count_kv_rows(model: WorldModel) -> dict[str, int]:
    """Live counts of the context rows f's cross-attention K and V layers project (all layers):
    what the dynamics-context cache must save. Shared with tests/test_planner.py."""
    rows = {"k": 0, "v": 0}
    for layer in model.f.decoder.layers:
        for name in rows:

            def hook(module, args, out, name=name):
                rows[name] += args[0].shape[:-1].numel()

            getattr(layer.cross_attn, name).register_forward_hook(hook)
    return rows


@pytest.mark.parametrize("kind", ["chunked", "autoregressive"])
def test_cached_dynamics_context_matches_uncached(kind):
    cfg = tiny_go2(dynamics_kind=kind)
    torch.manual_seed(0)
    model = WorldModel(cfg).eval()
    w = synthetic_windows(cfg, 3)
    h, n = cfg.history, 7
    z = model.encode(current_obs(w, h))
    hist = model.encode_history(w["proprio"][:, :h], w["actions"][:, :h])
    actions = torch.randn(
        n, cfg.horizon, cfg.action_dim, generator=torch.Generator().manual_seed(1)
    )
    rows = count_kv_rows(model)
    with torch.inference_mode():
        # N candidates sharing one history: a batch-1 context serves all of them
        z1, h1 = z[:1].expand(n, -1), hist[:1].expand(n, -1, -1)
        plain = model.dynamics(z1, actions, h1)
        assert rows["k"] == rows["v"] == cfg.dynamics.layers * n * (2 * h + 1)  # once, even for AR
        context = model.dynamics_context(z[:1], hist[:1])
        rows.update(k=0, v=0)
        cached = model.dynamics(z1, actions, h1, context=context)
        assert rows == {"k": 0, "v": 0}
        torch.testing.assert_close(cached, plain, atol=1e-5, rtol=0)
        # a per-row context (batch B) matches too
        batch = model.dynamics(z, actions[:3], hist, context=model.dynamics_context(z, hist))
        torch.testing.assert_close(batch, model.dynamics(z, actions[:3], hist), atol=1e-5, rtol=0)
        with pytest.raises(ValueError, match="dynamics context batch 3"):
            model.dynamics(z1, actions, h1, context=model.dynamics_context(z, hist))
        # autocast: the cache is built in the same precision as the plain path's K / V
        with torch.autocast("cpu", dtype=torch.bfloat16):
            plain16 = model.dynamics(z1, actions, h1)
            cached16 = model.dynamics(
                z1, actions, h1, context=model.dynamics_context(z[:1], hist[:1])
            )
        torch.testing.assert_close(cached16.float(), plain16.float(), atol=2e-2, rtol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kind", ["chunked", "autoregressive"])
def test_cached_dynamics_context_on_cuda(kind):
    cfg = tiny_go2(dynamics_kind=kind)
    torch.manual_seed(0)
    model = WorldModel(cfg).eval().cuda()
    g = torch.Generator().manual_seed(0)
    n, d = 472, cfg.latent_dim
    z, hist = (
        torch.randn(1, d, generator=g).cuda(),
        torch.randn(1, 2 * cfg.history, d, generator=g).cuda(),
    )
    actions = torch.randn(n, cfg.horizon, cfg.action_dim, generator=g).cuda()
    with torch.inference_mode():
        zn, hn = z.expand(n, -1), hist.expand(n, -1, -1)
        plain = model.dynamics(zn, actions, hn)
        cached = model.dynamics(zn, actions, hn, context=model.dynamics_context(z, hist))
        torch.testing.assert_close(cached, plain, atol=1e-5, rtol=0)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            plain16 = model.dynamics(zn, actions, hn)
            cached16 = model.dynamics(zn, actions, hn, context=model.dynamics_context(z, hist))
        torch.testing.assert_close(cached16.float(), plain16.float(), atol=2e-2, rtol=0)
