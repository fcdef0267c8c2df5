"""Transformer building blocks of the world model (post-LayerNorm, as in the official model)."""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

_INT64 = torch.iinfo(torch.int64)


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Inverted dropout; on CPU the keep mask is made from 16-bit slices of random int64 words
    (keep probability 1 - p, quantised to 1/65536), elsewhere it is F.dropout.

    Why: on CPU `bernoulli_` draws one Mersenne-Twister number per element, and the masks of
    the world model's dropout layers took a quarter of a Go2 pretraining step; a quarter of
    the words is ~5x cheaper. The draw uses torch's default generator, so seeding works the
    same way as for F.dropout. GPUs draw masks cheaply and fuse them (F.dropout).
    """
    if not training or p == 0.0:
        return x
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout probability must be in [0, 1), got {p}")
    if x.device.type != "cpu":
        return F.dropout(x, p, training=True)
    n = x.numel()
    words = torch.randint(
        _INT64.min, _INT64.max, ((n + 3) // 4,), dtype=torch.int64, device=x.device
    )
    threshold = round(p * 65536) - 32768  # int16 values >= threshold are kept
    keep = words.view(torch.int16)[:n].view(x.shape) >= threshold
    return x * keep * (65536 / (32768 - threshold))


class Dropout(nn.Module):
    """`dropout` as a module (the MLPs' hidden activations)."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class MLP(nn.Module):
    """Linear layers with GELU between them; dropout after each hidden activation."""

    def __init__(
        self, in_dim: int, hidden: list[int] | tuple[int, ...], out_dim: int, dropout: float = 0.0
    ):
        super().__init__()
        layers: list[nn.Module] = []
        prev = in_dim
        for width in hidden:
            layers += [nn.Linear(prev, width), nn.GELU()]
            if dropout > 0:
                layers.append(Dropout(dropout))
            prev = width
        layers.append(nn.Linear(prev, out_dim))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class Attention(nn.Module):
    """Multi-head attention with separate q / k / v / out projections (4 (D^2 + D) weights)."""

    def __init__(self, dim: int, heads: int, dropout: float):
        super().__init__()
        self.heads = heads
        self.dropout = dropout
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        return x.view(b, n, self.heads, d // self.heads).transpose(1, 2)

    def keys_values(self, context: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-head keys and values of `context` (B, n, D) -> 2 x (B, heads, n, D / heads)."""
        return self._split(self.k(context)), self._split(self.v(context))

    def attend(
        self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool
    ) -> torch.Tensor:
        """Attention of queries from `x` (B, m, D) to precomputed `keys_values`; keys and values
        of batch 1 are broadcast (a view, no copy) to the B queries."""
        b = x.shape[0]
        q = self._split(self.q(x))
        k, v = k.expand(b, -1, -1, -1), v.expand(b, -1, -1, -1)
        p = self.dropout if self.training else 0.0
        if p > 0 and q.device.type == "cpu":
            y = self._attend_with_dropout(q, k, v, causal)
        else:  # GPUs: the fused kernels, which draw their own dropout masks
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=causal)
        _, h, n, d = y.shape
        return self.out(y.transpose(1, 2).reshape(b, n, h * d))

    def _attend_with_dropout(self, q, k, v, causal: bool) -> torch.Tensor:
        """SDPA's math path (what it runs on CPU with dropout anyway) with `dropout`'s mask."""
        scores = (q * q.shape[-1] ** -0.5) @ k.transpose(-2, -1)  # scale the smaller operand
        if causal:
            m, n = scores.shape[-2:]
            future = torch.ones(m, n, dtype=torch.bool, device=q.device).triu(1)
            scores = scores.masked_fill(future, float("-inf"))
        return dropout(scores.softmax(dim=-1), self.dropout, True) @ v

    def forward(self, x: torch.Tensor, context: torch.Tensor, causal: bool) -> torch.Tensor:
        return self.attend(x, *self.keys_values(context), causal)


class ContextCache(NamedTuple):
    """A decoder's context tokens with every layer's cross-attention keys / values, computed once
    (`TransformerDecoder.cache`) so that repeated decoder calls on one context skip the K / V
    projections. Batch 1 serves any number of queries (the planner's candidates)."""

    tokens: torch.Tensor  # (B, n, D)
    keys_values: tuple[
        tuple[torch.Tensor, torch.Tensor], ...
    ]  # per layer, 2 x (B, heads, n, D/heads)


class EncoderLayer(nn.Module):
    """Self-attention + feed-forward, each followed by residual and LayerNorm."""

    def __init__(
        self, dim: int, heads: int, mlp_dim: int, drop_att: float, drop_mlp: float, causal: bool
    ):
        super().__init__()
        self.causal = causal
        self.attn = Attention(dim, heads, drop_att)
        self.mlp = MLP(dim, [mlp_dim], dim, drop_mlp)
        self.norm1 = nn.LayerNorm(dim)
        self.norm2 = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm1(x + self.attn(x, x, self.causal))
        return self.norm2(x + self.mlp(x))


class DecoderLayer(nn.Module):
    """Causal self-attention, cross-attention to a context, feed-forward (post-LN)."""

    def __init__(self, dim: int, heads: int, mlp_dim: int, drop_att: float, drop_mlp: float):
        super().__init__()
        self.self_attn = Attention(dim, heads, drop_att)
        self.cross_attn = Attention(dim, heads, drop_att)
        self.mlp = MLP(dim, [mlp_dim], dim, drop_mlp)
        self.norm1 = nn.LayerNorm(dim)
        self.norm2 = nn.LayerNorm(dim)
        self.norm3 = nn.LayerNorm(dim)

    def forward(
        self, x: torch.Tensor, context_kv: tuple[torch.Tensor, torch.Tensor]
    ) -> torch.Tensor:
        """`context_kv`: this layer's `cross_attn.keys_values(context)`."""
        x = self.norm1(x + self.self_attn(x, x, causal=True))
        x = self.norm2(x + self.cross_attn.attend(x, *context_kv, causal=False))
        return self.norm3(x + self.mlp(x))


class TransformerEncoder(nn.Module):
    def __init__(self, dim: int, att, drop_att: float, drop_mlp: float, causal: bool = False):
        super().__init__()
        self.layers = nn.ModuleList(
            EncoderLayer(dim, att.heads, dim * att.mlp_factor, drop_att, drop_mlp, causal)
            for _ in range(att.layers)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


class TransformerDecoder(nn.Module):
    def __init__(self, dim: int, att, drop_att: float, drop_mlp: float):
        super().__init__()
        self.layers = nn.ModuleList(
            DecoderLayer(dim, att.heads, dim * att.mlp_factor, drop_att, drop_mlp)
            for _ in range(att.layers)
        )

    def cache(self, context: torch.Tensor) -> ContextCache:
        """Every layer's cross-attention keys / values of `context` (B, n, D), for reuse."""
        keys_values = []
        for layer in self.layers:
            assert isinstance(layer, DecoderLayer)  # nn.ModuleList items are typed nn.Module
            keys_values.append(layer.cross_attn.keys_values(context))
        return ContextCache(context, tuple(keys_values))

    def forward(self, x: torch.Tensor, context: torch.Tensor | ContextCache) -> torch.Tensor:
        """x (B, m, D) attends to `context`: tokens (B, n, D) or their `cache` (batch B or 1)."""
        if not isinstance(context, ContextCache):
            context = self.cache(context)
        for layer, kv in zip(self.layers, context.keys_values, strict=True):
            x = layer(x, kv)
        return x


class SequenceEmbedding(nn.Module):
    """Per-step linear projection plus a learned position embedding for up to `max_len` steps."""

    def __init__(self, in_dim: int, dim: int, max_len: int):
        super().__init__()
        self.max_len = max_len
        self.proj = nn.Linear(in_dim, dim)
        self.pos = nn.Parameter(torch.randn(max_len, dim) * 0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        if n > self.max_len:
            raise ValueError(
                f"sequence of {n} steps is longer than the model's horizon {self.max_len}"
            )
        return self.proj(x) + self.pos[:n]
