"""Eq. 2 (pretraining) and Eq. 3 (dynamics-only adaptation) on scaler-normalised targets.

Eq. 2 per window: ||z^ - sg(E(o))||^2 + c1 (r^ - r)^2 + c2 (v^ - v)^2 + c3 1_e ||a^ - a||^2
with the official weights latent 1 / reward 1 / value 1 / action 4 (config.loss) and the expert
mask 1_e = cumulative product of the expert flags along the horizon: once a corrupted action
enters the chunk, no later action is a target for pi. Each term is a mean over its elements.
Optional terms outside the paper: reconstruction (the Table I ablation) and the privileged task
state read from z_t (LossWeights.state), with near-field copies of named terms (`near_field`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from simdist_planner.model.config import LossWeights
from simdist_planner.model.world_model import WorldModel, unwrap

TERMS = ("latent", "reward", "value", "action", "reconstruction", "state")
NearField = Sequence[tuple[slice, float]]  # (columns of the state vector, scale) per term


@dataclass
class LossTerms:
    """The weighted total and every unweighted term (for logging and tests)."""

    total: torch.Tensor
    latent: torch.Tensor
    reward: torch.Tensor
    value: torch.Tensor
    action: torch.Tensor
    reconstruction: torch.Tensor
    state: torch.Tensor

    def as_floats(self) -> dict[str, float]:
        return {k: float(getattr(self, k).detach()) for k in ("total", *TERMS)}


def expert_mask(expert: torch.Tensor) -> torch.Tensor:
    """(B, T) expert flags -> (B, T) float mask, zero from the first non-expert action on."""
    return torch.cumprod((expert.float() > 0.5).float(), dim=1)


def latent_loss(pred: dict) -> torch.Tensor:
    return ((pred["latents"] - pred["target_latents"]) ** 2).mean()


def near_field_slices(layout, near_field: dict[str, float], setting: str) -> NearField:
    """[(columns of the state vector, scale)] of the terms named in `near_field` (the setting
    `setting` of PretrainConfig, named in the error)."""
    starts = layout.state_slices()
    unknown = sorted(set(near_field) - set(starts))
    if unknown:
        raise ValueError(
            f"{setting} names {unknown}; the data's task state has the terms "
            f"{sorted(starts) or 'none'}"
        )
    return [(starts[name], float(scale)) for name, scale in near_field.items()]


def state_targets(scaler, state: torch.Tensor, near: NearField) -> torch.Tensor:
    """The scaler-normalised state and, per near-field term, tanh(x / scale).

    tanh is steepest within +-scale, so millimetres at a target count as much as decimetres
    elsewhere (normalised by the term's spread over all the data, 19 cm for the peg's offset from
    the hole, they cost nothing).
    """
    parts = [scaler.normalize("state", state)]
    parts += [torch.tanh(state[..., cols] / scale) for cols, scale in near]
    return torch.cat(parts, dim=-1)


def world_model_loss(
    model: nn.Module, window: dict, weights: LossWeights | None = None, near_field: NearField = ()
) -> LossTerms:
    """Eq. 2 for one batch of windows; `model` may be wrapped in DDP / torch.compile; `weights`
    default to the model config's. `near_field` (near_field_slices) adds tanh copies of those
    state columns to the state term, read from the state head's denormalised output."""
    core = unwrap(model)
    w = weights or core.config.loss
    pred = _float(model(window))  # losses in fp32 also under bf16 autocast
    scaler = core.scaler
    rewards = scaler.normalize_scalar("rewards", window["rewards"].float())
    values = scaler.normalize_scalar("values", window["values"].float())
    t = rewards.shape[1]
    _check_shape("values", window["values"], rewards.shape)
    _check_shape("expert", window["expert"], rewards.shape)
    h = window["actions"].shape[1] - t
    actions = scaler.normalize("actions", window["actions"][:, h:].float())
    mask = expert_mask(window["expert"]).unsqueeze(-1)

    latent = latent_loss(pred)
    reward = ((pred["rewards"] - rewards) ** 2).mean()
    value = ((pred["values"] - values) ** 2).mean()
    action = (((pred["actions"] - actions) * mask) ** 2).mean()
    recon = latent.new_zeros(())
    if "reconstruction" in pred:
        recon = sum(
            ((pred["reconstruction"][k] - v) ** 2).mean()
            for k, v in pred["reconstruction_targets"].items()
        )
    state = latent.new_zeros(())
    if w.state > 0:
        if "state" not in pred:
            raise ValueError(
                f"loss.state is {w.state} but the {core.config.robot} model has no "
                "state head (state_dim 0)"
            )
        if "state" not in window:
            raise ValueError(
                "loss.state > 0 needs the privileged task state in the window "
                "('state'); shards generated before it was stored have none"
            )
        _check_shape("state", window["state"], pred["state"].shape)
        target = state_targets(scaler, window["state"].float(), near_field)
        guess = state_targets(scaler, scaler.denormalize("state", pred["state"]), near_field)
        state = ((guess - target) ** 2).mean()
    total = (
        w.latent * latent
        + w.reward * reward
        + w.value * value
        + w.action * action
        + w.reconstruction * recon
        + w.state * state
    )
    return LossTerms(total, latent, reward, value, action, recon, state)


def adaptation_loss(model: nn.Module, window: dict) -> torch.Tensor:
    """Eq. 3: the latent-dynamics term only (targets from the frozen encoder)."""
    return latent_loss(_float(model(window)))


def _float(pred: dict) -> dict:
    return {
        k: ({n: t.float() for n, t in v.items()} if isinstance(v, dict) else v.float())
        for k, v in pred.items()
    }


def _check_shape(name: str, x: torch.Tensor, shape) -> None:
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"window {name} has shape {tuple(x.shape)}, expected {tuple(shape)}")


def freeze_for_adaptation(
    model: WorldModel, train_encoder: bool = False, train_value: bool = False
) -> list[nn.Parameter]:
    """Prepare Eq. 3: only f trains (train mode, dropout on); everything else frozen, eval mode.

    `train_encoder` / `train_value` unfreeze E / V as well (the paper's ablations, which fail).
    Returns the trainable parameters for the optimiser. Call again after any `model.train()`.
    """
    trainable_parts = (
        {"dynamics"}
        | ({"encoder"} if train_encoder else set())
        | ({"value"} if train_value else set())
    )
    model.eval()
    params = []
    for name, p in model.named_parameters():
        p.requires_grad_(model.part_of(name) in trainable_parts)
        if p.requires_grad:
            params.append(p)
    model.f.train()
    if train_encoder:
        model.encoder.train()
    if train_value:
        model.value_head.train()
    return params
