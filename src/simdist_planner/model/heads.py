"""Dynamics f, reward R, value V, base policy pi and the optional observation decoder.

Every module here works on normalised quantities; `WorldModel` converts raw units at its API.
Context = the history tokens with the z_t token appended.
"""

from __future__ import annotations

import torch
from torch import nn

from simdist_planner.model.config import WorldModelConfig
from simdist_planner.model.transformers import (
    MLP,
    ContextCache,
    SequenceEmbedding,
    TransformerDecoder,
    TransformerEncoder,
)


class ChunkedDynamics(nn.Module):
    """f: all T future latents in ONE decoder pass (action queries, causal self-attention,
    cross-attention to the context). Output i depends on actions 0..i only."""

    def __init__(self, cfg: WorldModelConfig):
        super().__init__()
        self.action_embed = SequenceEmbedding(cfg.action_dim, cfg.latent_dim, cfg.horizon)
        self.decoder = TransformerDecoder(
            cfg.latent_dim, cfg.dynamics, cfg.dropout_attention, cfg.dropout_mlp
        )

    def forward(self, actions: torch.Tensor, context: torch.Tensor | ContextCache) -> torch.Tensor:
        return self.decoder(self.action_embed(actions), context)


class AutoregressiveDynamics(nn.Module):
    """Baseline f: one decoder pass per step, z^_{k+1} = g(z^_k, a_k, context), same width."""

    def __init__(self, cfg: WorldModelConfig):
        super().__init__()
        self.action_embed = SequenceEmbedding(cfg.action_dim, cfg.latent_dim, cfg.horizon)
        self.latent_in = nn.Linear(cfg.latent_dim, cfg.latent_dim)
        self.decoder = TransformerDecoder(
            cfg.latent_dim, cfg.dynamics, cfg.dropout_attention, cfg.dropout_mlp
        )

    def forward(self, actions: torch.Tensor, context: torch.Tensor | ContextCache) -> torch.Tensor:
        """The context's keys / values are projected once and reused by all T steps; a batch-1
        `ContextCache` broadcasts to the B action sequences."""
        if not isinstance(context, ContextCache):
            context = self.decoder.cache(context)
        queries = self.action_embed(actions)
        z = context.tokens[:, -1]  # the z_t token
        out = []
        for k in range(actions.shape[1]):
            z = self.decoder((queries[:, k] + self.latent_in(z)).unsqueeze(1), context).squeeze(1)
            out.append(z)
        return torch.stack(out, dim=1)


class TransformerHead(nn.Module):
    """Seq2seq reward or value model: embed each step, unmasked self-attention, scalar per step."""

    def __init__(self, in_dim: int, cfg: WorldModelConfig, att):
        super().__init__()
        self.embed = SequenceEmbedding(in_dim, cfg.latent_dim, cfg.horizon)
        self.encoder = TransformerEncoder(
            cfg.latent_dim, att, cfg.dropout_attention, cfg.dropout_mlp
        )
        self.out = nn.Linear(cfg.latent_dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.encoder(self.embed(x))).squeeze(-1)


class MLPHead(nn.Module):
    """Per-step reward or value MLP (the ablation against the seq2seq transformer heads)."""

    def __init__(self, in_dim: int, cfg: WorldModelConfig):
        super().__init__()
        hidden = cfg.latent_dim * cfg.mlp_head_hidden_factor
        self.mlp = MLP(in_dim, [hidden, hidden], 1, cfg.dropout_mlp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(x).squeeze(-1)


def make_head(in_dim: int, cfg: WorldModelConfig, att) -> nn.Module:
    return (
        TransformerHead(in_dim, cfg, att)
        if cfg.head_kind == "transformer"
        else MLPHead(in_dim, cfg)
    )


def _zero_linear(n_in: int, n_out: int) -> nn.Linear:
    layer = nn.Linear(n_in, n_out)
    nn.init.zeros_(layer.weight)
    nn.init.zeros_(layer.bias)
    return layer


class PolicyHead(nn.Module):
    """pi: decodes an action chunk from per-step queries (command embeddings when the robot has a
    command, learned queries otherwise) with causal self-attention and cross-attention."""

    def __init__(self, cfg: WorldModelConfig):
        super().__init__()
        d = cfg.latent_dim
        self.horizon = cfg.horizon
        self.query: SequenceEmbedding | nn.Parameter
        if cfg.command_dim:
            self.query = SequenceEmbedding(cfg.command_dim, d, cfg.horizon)
        else:
            self.query = nn.Parameter(torch.randn(cfg.horizon, d) * 0.02)
        self.decoder = TransformerDecoder(d, cfg.policy, cfg.dropout_attention, cfg.dropout_mlp)
        self.out = nn.Linear(d, cfg.action_dim)
        # WorldModelConfig.policy_proprio_skip: zero at first, so pi starts as without it
        self.proprio_skip = (
            _zero_linear(cfg.proprio_dim, cfg.horizon * cfg.action_dim)
            if cfg.policy_proprio_skip
            else None
        )

    def forward(
        self,
        context: torch.Tensor,
        commands: torch.Tensor | None,
        steps: int,
        proprio: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """`steps` <= T actions; `commands` (B, >= steps, C) when the robot has a command;
        `proprio` (B, P) normalised o^p_t, needed with the proprio skip."""
        if steps > self.horizon:
            raise ValueError(
                f"policy chunk of {steps} steps is longer than the horizon {self.horizon}"
            )
        if isinstance(self.query, SequenceEmbedding):  # the robot has a command
            if commands is None:
                raise ValueError("this policy reads commands (B, >= steps, C); got None")
            queries = self.query(commands[:, :steps])
        else:
            if commands is not None:
                raise ValueError("this policy has no command input; got commands")
            queries = self.query[:steps].expand(context.shape[0], steps, -1)
        actions = self.out(self.decoder(queries, context))
        if self.proprio_skip is None:
            return actions
        if proprio is None:
            raise ValueError(
                "this policy reads the proprio (policy_proprio_skip): pass the current proprio"
            )
        skip = self.proprio_skip(proprio).view(-1, self.horizon, actions.shape[-1])
        return actions + skip[:, :steps]


class ObservationDecoder(nn.Module):
    """Reconstructs normalised proprio, height map and low-resolution images from a latent
    (only built when the reconstruction loss weight is > 0: the Table I ablation)."""

    def __init__(self, cfg: WorldModelConfig):
        super().__init__()
        self.sizes = {"proprio": cfg.proprio_dim}
        if cfg.height_map is not None:
            self.sizes["height_map"] = cfg.height_map.shape[0] * cfg.height_map.shape[1]
        if cfg.image is not None:
            r = cfg.reconstruction_image_size
            self.sizes["images"] = cfg.num_cameras * 3 * r * r
        hidden = cfg.latent_dim * cfg.encoder_hidden_factor
        self.mlp = MLP(cfg.latent_dim, [hidden, hidden], sum(self.sizes.values()))

    def forward(self, z: torch.Tensor) -> dict[str, torch.Tensor]:
        parts = torch.split(self.mlp(z), list(self.sizes.values()), dim=-1)
        return dict(zip(self.sizes, parts))
