"""Synthetic training windows with known linear dynamics, in the docs/architecture.md format.

Used by the tests (causality, overfitting, DDP / resume checks) and by `simdist-pretrain
--synthetic` to smoke-run the pipeline without a generated dataset. The system is fixed by
`system_seed`, so separate calls sample windows of the same dynamics.
"""

from __future__ import annotations

import torch

from simdist_planner.model.config import WorldModelConfig


def synthetic_windows(
    config: WorldModelConfig,
    batch: int,
    seed: int = 0,
    system_seed: int = 0,
    history: int | None = None,
    horizon: int | None = None,
    corrupt_prob: float = 0.3,
) -> dict[str, torch.Tensor]:
    """`batch` windows of H + T + 1 observations; actions are a linear expert's, corrupted
    (flag 0, large noise) with probability `corrupt_prob` per step."""
    h = config.history if history is None else history
    t = config.horizon if horizon is None else horizon
    n = h + t + 1
    p, a_dim, c_dim = config.proprio_dim, config.action_dim, config.command_dim
    sysg = torch.Generator().manual_seed(system_seed)
    A = 0.9 * torch.linalg.qr(torch.randn(p, p, generator=sysg))[0]  # stable: spectral norm 0.9
    B = 0.3 * torch.randn(p, a_dim, generator=sysg)
    K = 0.5 * torch.linalg.pinv(B) @ A  # expert: x' = (I - 0.5 B B^+) A x contracts
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, p, generator=g)
    command = torch.randn(batch, c_dim, generator=g) * 0.5
    states, actions, expert = [x], [], []
    for _ in range(n - 1):
        clean = torch.rand(batch, generator=g) > corrupt_prob
        a = -x @ K.T
        a = torch.where(clean[:, None], a, a + 1.5 * torch.randn(batch, a_dim, generator=g))
        x = x @ A.T + a @ B.T
        states.append(x)
        actions.append(a)
        expert.append(clean)
    states_t = torch.stack(states, 1)  # (B, n, P)
    rewards_all = -(states_t**2).mean(-1)
    if c_dim:
        rewards_all = rewards_all + (
            states_t[..., : min(p, c_dim)] * command[:, None, : min(p, c_dim)]
        ).sum(-1)
    window = {
        "proprio": states_t,
        "actions": torch.stack(actions, 1),
        "rewards": rewards_all[:, h : h + t],
        "values": 3.0 * rewards_all[:, h + 1 : h + t + 1],
        "expert": torch.stack(expert, 1)[:, h : h + t],
    }
    if c_dim:
        window["command"] = command[:, None, :].expand(batch, n, c_dim).contiguous()
    if config.height_map is not None:
        rows, cols = config.height_map.shape
        W = 0.3 * torch.randn(rows * cols, p, generator=sysg)
        window["height_map"] = (states_t @ W.T).reshape(batch, n, rows, cols)
    if config.state_dim:  # the privileged "task state" of o_t: a fixed linear view of x_t
        S = torch.randn(config.state_dim, p, generator=sysg)
        window["state"] = states_t[:, h] @ S.T
    if config.image is not None:
        ch, hh, ww = 3, config.image.height, config.image.width
        W = torch.randn(config.num_cameras * ch * hh * ww, p, generator=sysg)
        window["images"] = torch.sigmoid(states_t @ W.T).reshape(
            batch, n, config.num_cameras, ch, hh, ww
        )
    return window
