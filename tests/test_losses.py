"""Eq. 2 / Eq. 3: expert masking, stop-gradient targets, dynamics-only adaptation, overfitting."""

import pytest
import torch

from simdist_planner.data.schema import StepLayout
from simdist_planner.data.synthetic import synthetic_windows
from simdist_planner.model.config import (
    AttentionConfig,
    ImageEncoderConfig,
    LossWeights,
    go2_config,
    ur5e_config,
)
from simdist_planner.model.losses import (
    adaptation_loss,
    expert_mask,
    freeze_for_adaptation,
    near_field_slices,
    world_model_loss,
)
from simdist_planner.model.world_model import WorldModel


def tiny_go2(**kw):
    att = AttentionConfig(1, 2)
    base = dict(
        latent_dim=16,
        history=3,
        horizon=5,
        dynamics=AttentionConfig(2, 2),
        reward=att,
        value=att,
        policy=att,
    )
    base.update(kw)
    return go2_config(**base)


def fitted(cfg, window):
    model = WorldModel(cfg)
    keys = {"proprio", "actions", "rewards", "values", "command", "height_map", "state"}
    model.scaler.fit({k: v for k, v in window.items() if k in keys and k in model.scaler.dims})
    return model


def test_expert_mask_is_cumulative_product():
    flags = torch.tensor([[1, 1, 0, 1, 1], [1, 1, 1, 1, 1], [0, 1, 1, 1, 1]], dtype=torch.bool)
    mask = expert_mask(flags)
    assert mask.tolist() == [[1, 1, 0, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]]


def test_corrupted_actions_do_not_enter_policy_term():
    cfg = tiny_go2()
    w = synthetic_windows(cfg, 6, corrupt_prob=0.3)
    model = fitted(cfg, w).eval()
    mask = expert_mask(w["expert"])
    assert 0 < mask.sum() < mask.numel()
    h = cfg.history
    base = world_model_loss(model, w).action
    garbage = dict(w)
    garbage["actions"] = w["actions"].clone()
    future = garbage["actions"][:, h:]
    future[mask == 0] = 1e3 * torch.randn_like(future[mask == 0])
    # the masked targets are garbage now; the policy's inputs (history) are unchanged
    torch.testing.assert_close(world_model_loss(model, garbage).action, base, atol=0, rtol=0)
    changed = dict(w)
    changed["actions"] = w["actions"].clone()
    changed["actions"][:, h:][mask == 1] += 1.0
    assert world_model_loss(model, changed).action > base + 1e-3


def test_target_latents_are_stop_gradient():
    cfg = tiny_go2()
    w = synthetic_windows(cfg, 2)
    model = fitted(cfg, w)
    proprio = w["proprio"].clone().requires_grad_(True)
    terms = world_model_loss(model, {**w, "proprio": proprio})
    terms.latent.backward()
    h = cfg.history
    assert proprio.grad[:, h].abs().sum() > 0  # z_t feeds the prediction
    assert proprio.grad[:, h + 1 :].abs().sum() == 0  # E(o_{t+1..t+T}) are targets only


def test_nested_obs_window_gives_the_same_loss():
    cfg = tiny_go2()
    w = synthetic_windows(cfg, 3)
    model = fitted(cfg, w).eval()
    obs_keys = ("proprio", "height_map", "command")
    nested = {
        "obs": {k: w[k] for k in obs_keys},
        **{k: v for k, v in w.items() if k not in obs_keys},
    }
    torch.testing.assert_close(
        world_model_loss(model, nested).total, world_model_loss(model, w).total
    )


def test_loss_weights_and_terms():
    cfg = tiny_go2(loss=LossWeights(latent=1, reward=2, value=3, action=4, reconstruction=0.5))
    w = synthetic_windows(cfg, 3)
    model = fitted(cfg, w).eval()
    t = world_model_loss(model, w)
    expect = t.latent + 2 * t.reward + 3 * t.value + 4 * t.action + 0.5 * t.reconstruction
    torch.testing.assert_close(t.total, expect)
    assert t.reconstruction > 0
    with pytest.raises(ValueError, match="window values has shape"):
        world_model_loss(model, {**w, "values": w["values"][:, :2]})


def _adapt_one_step(model, window, **switches):
    params = freeze_for_adaptation(model, **switches)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    opt = torch.optim.Adam(params, lr=1e-2)
    loss = adaptation_loss(model, window)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return before, model.state_dict()


@pytest.mark.parametrize(
    "cfg",
    [
        tiny_go2(),
        # ResNet-18 has BatchNorm running statistics: they must stay untouched too (eval mode)
        ur5e_config(
            latent_dim=16,
            history=2,
            horizon=3,
            image=ImageEncoderConfig(("wrist",), 32, 32),
            dynamics=AttentionConfig(1, 2),
            reward=AttentionConfig(1, 1),
            value=AttentionConfig(1, 1),
            policy=AttentionConfig(1, 2),
        ),
    ],
    ids=["go2", "ur5e_resnet"],
)
def test_adaptation_changes_only_dynamics(cfg):
    w = synthetic_windows(cfg, 3)
    model = fitted(cfg, w)
    before, after = _adapt_one_step(model, w)
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed, "the adaptation step changed nothing"
    assert all(k.startswith("f.") for k in changed), sorted(
        k for k in changed if not k.startswith("f.")
    )
    assert any(k.startswith("f.decoder") for k in changed)
    for name, p in model.named_parameters():
        if not name.startswith("f."):
            assert p.grad is None, f"{name} got a gradient"
    assert model.f.training and not model.encoder.training and not model.value_head.training


def test_adaptation_ablation_switches_unfreeze_encoder_and_value():
    cfg = tiny_go2()
    w = synthetic_windows(cfg, 3)
    model = fitted(cfg, w)
    before, after = _adapt_one_step(model, w, train_encoder=True)
    changed = {k.split(".")[0] for k in before if not torch.equal(before[k], after[k])}
    assert changed == {"f", "encoder"}
    params = freeze_for_adaptation(model, train_value=True)
    names = {n.split(".")[0] for n, p in model.named_parameters() if any(p is q for q in params)}
    assert names == {"f", "value_head"}


def test_overfit_drives_every_term_down_tenfold():
    torch.manual_seed(0)
    cfg = tiny_go2(
        latent_dim=32,
        history=2,
        horizon=4,
        dynamics=AttentionConfig(1, 2),
        dropout_mlp=0.0,
        dropout_attention=0.0,
        loss=LossWeights(reconstruction=1.0, state=1.0),
        state_dim=4,
    )
    w = synthetic_windows(cfg, 8, seed=1)
    model = fitted(cfg, w)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    first = None
    for _ in range(200):
        terms = world_model_loss(model, w)
        opt.zero_grad()
        terms.total.backward()
        opt.step()
        first = first or terms.as_floats()
    last = world_model_loss(model, w).as_floats()
    for k in ("latent", "reward", "value", "action", "reconstruction", "state"):
        assert last[k] * 10 <= first[k], f"{k}: {first[k]:.4g} -> {last[k]:.4g}"


def test_near_field_makes_millimetres_of_a_state_term_count():
    """The state term with `near_field`: a guess 2 mm off a term whose spread is metres costs
    next to nothing normalised, and tanh(2 mm / 5 mm)^2 more as a near-field copy; the state head
    is set to output that guess for every window so the term is computed by hand."""
    cfg = tiny_go2(loss=LossWeights(state=1.0), state_dim=3)
    w = synthetic_windows(cfg, 4, seed=3)
    model = fitted(cfg, w).eval()
    w["state"] = torch.zeros_like(w["state"])  # every window at its target
    guess = torch.tensor([0.002, 0.0, 0.0])
    last = model.state_head.net[-1]
    with torch.no_grad():
        last.weight.zero_()
        last.bias.copy_(model.scaler.normalize("state", guess))
    target_n = model.scaler.normalize("state", torch.zeros(3))
    plain = ((model.scaler.normalize("state", guess) - target_n) ** 2).mean()
    near = [(slice(0, 1), 0.005)]
    torch.testing.assert_close(world_model_loss(model, w).state, plain)
    by_hand = (3 * plain + torch.tanh(torch.tensor(0.4)) ** 2) / 4
    torch.testing.assert_close(world_model_loss(model, w, near_field=near).state, by_hand)
    assert by_hand > 100 * plain
    layout = StepLayout(
        proprio_terms=(("joint_pos", 3),), action_dim=2, state_terms=(("hole", 2), ("grasp", 1))
    )
    assert near_field_slices(layout, {"grasp": 0.01}, "state_near_field") == [(slice(2, 3), 0.01)]
    with pytest.raises(
        ValueError, match=r"state_near_field names \['peg'\]; .* terms \['grasp', 'hole'\]"
    ):
        near_field_slices(layout, {"peg": 0.01}, "state_near_field")


def test_state_term_trains_the_encoder_to_hold_the_task_state():
    """The auxiliary state loss (LossWeights.state) reads the task state from z_t = E(o_t):
    weighted into the total, its gradient reaches E but not f, R, V or pi, and a window
    without the state is an error rather than a silent zero."""
    cfg = tiny_go2(loss=LossWeights(state=2.0), state_dim=3)
    w = synthetic_windows(cfg, 4, seed=3)
    assert w["state"].shape == (4, 3)
    model = fitted(cfg, w).eval()
    t = world_model_loss(model, w)
    assert t.state > 0
    torch.testing.assert_close(t.total, t.latent + t.reward + t.value + 4 * t.action + 2 * t.state)
    model.zero_grad()
    t.state.backward()
    grads = {
        model.part_of(n)
        for n, p in model.named_parameters()
        if p.grad is not None and p.grad.abs().sum() > 0
    }
    assert {"encoder", "state"} <= grads and not grads & {"dynamics", "reward", "value", "policy"}
    with pytest.raises(ValueError, match="needs the privileged task state"):
        world_model_loss(model, {k: v for k, v in w.items() if k != "state"})
    with pytest.raises(ValueError, match="no state head"):
        world_model_loss(fitted(tiny_go2(), w).eval(), w, LossWeights(state=1.0))
    # raw units out: the head's normalised output mapped back through the fitted scaler
    z = model.encode({k: w[k][:, 3] for k in ("proprio", "height_map")})
    torch.testing.assert_close(
        model.state(z), model.scaler.denormalize("state", model.state_head(z))
    )
