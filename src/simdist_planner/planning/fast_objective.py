"""The planner's objective on the inference fast path: the same f, R and V as the eager
`WorldModel` calls, with the same weights, arranged for throughput at planning batch sizes.

MPPI scores hundreds of candidate chunks per iteration (official Go2: 472 x 25 tokens), and on
a CPU the eager modules spend most of that time outside the arithmetic that matters
(docs/planner.md, "Where a plan's time goes"). What this path does differently, and why each
step is exact up to float rounding:

- Attention with head dimensions of 8-16 and 25-51 keys runs as batched matmuls on one
  contiguous (batch x heads) layout with an additive causal mask, not through
  `scaled_dot_product_attention`, whose CPU kernel is 2-3x slower at these sizes. q, k and v
  come from one projection with the three weight matrices stacked, read from the modules at
  every call, so a model updated in place is never stale.
- Cross-attention to the context: its keys / values are shared by every candidate (batch 1,
  `WorldModel.dynamics_context`), so the query and output projections fold into them once per
  step (`SharedCrossAttention`) and each layer's cross-attention is two thin matmuls and a
  softmax over all candidates' tokens at once.
- The return reads only the last predicted value, so V's final layer computes its query,
  feed-forward and output for the last token alone (the keys and values of every token are
  still computed; attention is unmasked, so the last token sees all of them).
- Actions are normalised once for f and R; the command's tokens are normalised once per step.
- On CPU each Linear (+ GELU) is one oneDNN call (`linear`), and softmax over rows shorter than
  SHORT_ROW is computed by hand (`_softmax_rows`): both measured faster than torch's defaults at
  these shapes.

Models outside this layout (MLP heads, any other decoder) are scored through the model's own
methods for the parts that differ; `FastObjective.supports` says whether a model can use it.
The eager path (`MPPIPlanner` with `evaluator="eager"`) stays the reference: tests compare the
two on the same candidates (returns, elite sets, the executed action).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from simdist_planner.model.heads import AutoregressiveDynamics, ChunkedDynamics, TransformerHead
from simdist_planner.model.transformers import (
    MLP,
    Attention,
    ContextCache,
    DecoderLayer,
    Dropout,
    EncoderLayer,
    TransformerDecoder,
)
from simdist_planner.model.world_model import WorldModel


def _onednn(x: torch.Tensor) -> bool:
    """oneDNN's fused linear (+ activation) kernels: CPU float32 with torch's mkldnn build."""
    return x.device.type == "cpu" and x.dtype == torch.float32 and torch.backends.mkldnn.enabled


def linear(x: torch.Tensor, weight, bias, gelu: str | None = None) -> torch.Tensor:
    """F.linear, optionally followed by GELU (`gelu`: its `approximate`, "none" or "tanh").

    On CPU the pair runs as one oneDNN call (the activation fused into the matmul's epilogue),
    which at the planner's thin shapes (11,800 x 64 -> 256) is faster than addmm and a separate
    GELU pass; elsewhere it is F.linear and F.gelu.
    """
    if _onednn(x):
        flat = x.reshape(-1, x.shape[-1])
        if gelu is None:
            y = torch.ops.mkldnn._linear_pointwise(flat, weight, bias, "none", [], "")
        else:
            y = torch.ops.mkldnn._linear_pointwise(flat, weight, bias, "gelu", [], gelu)
        return y.view(*x.shape[:-1], weight.shape[0])
    y = F.linear(x, weight, bias)
    return y if gelu is None else F.gelu(y, approximate=gelu)


def mlp(module: MLP, x: torch.Tensor) -> torch.Tensor:
    """`module(x)` in inference (dropout off), each Linear + GELU pair fused by `linear`."""
    layers = [m for m in module.net if not isinstance(m, Dropout)]
    i = 0
    while i < len(layers):
        layer = layers[i]
        if not isinstance(layer, nn.Linear):
            raise TypeError(f"unexpected {type(layer).__name__} in an MLP")
        act = layers[i + 1] if i + 1 < len(layers) else None
        if isinstance(act, nn.GELU):
            x = linear(x, layer.weight, layer.bias, act.approximate)
            i += 2
        else:
            x = linear(x, layer.weight, layer.bias)
            i += 1
    return x


SHORT_ROW = 16  # rows shorter than this: the reductions by hand (below)


def _softmax_rows(x: torch.Tensor, row: int) -> torch.Tensor:
    """Softmax over consecutive groups of `row` elements of contiguous `x`, as a 2-D view (torch's
    CPU kernel is measurably slower on the same rows viewed with more dimensions). Rows shorter
    than SHORT_ROW (the UR5e's 5 and 11 keys) take max, exp and sum as separate passes, which on
    CPU is several times faster than torch's softmax kernel on such rows; longer rows use it."""
    flat = x.view(-1, row)
    if row >= SHORT_ROW:
        return flat.softmax(-1).view(x.shape)
    e = (flat - flat.amax(-1, keepdim=True)).exp_()
    return e.div_(e.sum(-1, keepdim=True)).view(x.shape)


def _heads(attn: Attention, dim: int) -> tuple[int, int]:
    return attn.heads, dim // attn.heads


def _qkv(attn: Attention, x: torch.Tensor) -> torch.Tensor:
    """q, k, v of `x` (B, n, D) from one stacked projection -> (3, B, heads, n, d) contiguous."""
    b, n, dim = x.shape
    h, d = _heads(attn, dim)
    weight = torch.cat((attn.q.weight, attn.k.weight, attn.v.weight))
    bias = torch.cat((attn.q.bias, attn.k.bias, attn.v.bias))
    return linear(x, weight, bias).view(b, n, 3, h, d).permute(2, 0, 3, 1, 4).contiguous()


def self_attention(attn: Attention, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """`attn(x, x, causal)` in inference: `mask` (n, n) is the additive causal mask, or None for
    unmasked attention."""
    b, n, dim = x.shape
    h, d = _heads(attn, dim)
    q, k, v = (t.view(b * h, n, d) for t in _qkv(attn, x))
    if mask is None:
        scores = torch.bmm(q, k.transpose(1, 2)).mul_(d**-0.5)
    else:
        scores = torch.baddbmm(mask, q, k.transpose(1, 2), alpha=d**-0.5)
    y = torch.bmm(_softmax_rows(scores, n), v).view(b, h, n, d).transpose(1, 2).reshape(b, n, dim)
    return linear(y, attn.out.weight, attn.out.bias)


def last_token_attention(attn: Attention, x: torch.Tensor) -> torch.Tensor:
    """The last token's row of unmasked `attn(x, x)`: (B, n, D) -> (B, 1, D)."""
    b, n, dim = x.shape
    h, d = _heads(attn, dim)
    kv_weight = torch.cat((attn.k.weight, attn.v.weight))
    kv_bias = torch.cat((attn.k.bias, attn.v.bias))
    kv = linear(x, kv_weight, kv_bias).view(b, n, 2, h, d).permute(2, 0, 3, 1, 4)
    k, v = kv[0].reshape(b * h, n, d), kv[1].reshape(b * h, n, d)
    q = linear(x[:, -1:], attn.q.weight, attn.q.bias).view(b * h, 1, d)
    scores = torch.bmm(q, k.transpose(1, 2)).mul_(d**-0.5)
    y = torch.bmm(_softmax_rows(scores, n), v).view(b, 1, dim)
    return linear(y, attn.out.weight, attn.out.bias)


@dataclass(frozen=True)
class SharedCrossAttention:
    """One layer's cross-attention to a context shared by every query, with the query and output
    projections folded into the context's keys and values.

    For head j with queries q_j = x W_qj^T + b_qj, the scores q_j k_j^T / sqrt(d) are
    x (W_qj^T k_j^T / sqrt(d)) + b_qj k_j^T / sqrt(d): one (D -> heads x m) linear map of x.
    The output sum_j softmax(s_j) v_j W_oj^T + b_o is likewise one (heads x m -> D) map of the
    stacked attention weights. Two thin matmuls replace the q projection, two batched matmuls
    per head and the transposes between them.
    """

    heads: int
    score_weight: torch.Tensor  # (heads * m, D)
    score_bias: torch.Tensor  # (heads * m,)
    out_weight: torch.Tensor  # (D, heads * m)
    out_bias: torch.Tensor  # (D,)

    @classmethod
    def fold(cls, attn: Attention, k: torch.Tensor, v: torch.Tensor) -> "SharedCrossAttention":
        """`k`, `v`: the context's per-head keys / values (1, heads, m, d) (`ContextCache`)."""
        _, h, m, d = k.shape
        dim = h * d
        keys = k[0] * d**-0.5  # (heads, m, d)
        wq = attn.q.weight.view(h, d, dim)
        score_weight = torch.einsum("jde,jid->jie", wq, keys).reshape(h * m, dim)
        score_bias = torch.einsum("jd,jid->ji", attn.q.bias.view(h, d), keys).reshape(h * m)
        wo = attn.out.weight.view(dim, h, d)
        out_weight = torch.einsum("jid,ojd->oji", v[0], wo).reshape(dim, h * m)
        return cls(h, score_weight.contiguous(), score_bias, out_weight.contiguous(), attn.out.bias)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Queries `x` (B, n, D) -> the attention output (B, n, D)."""
        b, n, _ = x.shape
        scores = linear(x, self.score_weight, self.score_bias)  # (B, n, heads * m)
        weights = _softmax_rows(scores, scores.shape[-1] // self.heads)
        return linear(weights, self.out_weight, self.out_bias)


def _decode(decoder: TransformerDecoder, x, cross: tuple[SharedCrossAttention, ...], mask):
    for layer, cross_attention in zip(decoder.layers, cross, strict=True):
        layer: DecoderLayer
        x = layer.norm1(x + self_attention(layer.self_attn, x, mask))
        x = layer.norm2(x + cross_attention(x))
        x = layer.norm3(x + mlp(layer.mlp, x))
    return x


def _encode(layers, x: torch.Tensor) -> torch.Tensor:
    for layer in layers:
        layer: EncoderLayer
        x = layer.norm1(x + self_attention(layer.attn, x, None))
        x = layer.norm2(x + mlp(layer.mlp, x))
    return x


def _head_last(head: TransformerHead, x: torch.Tensor) -> torch.Tensor:
    """A seq2seq head's output for the last token only: (B, n, in) -> (B,)."""
    x = _encode(head.encoder.layers[:-1], head.embed(x))
    last: EncoderLayer = head.encoder.layers[-1]
    y = last.norm1(x[:, -1:] + last_token_attention(last.attn, x))
    y = last.norm2(y + mlp(last.mlp, y))
    return head.out(y)[:, 0, 0]


def _causal_mask(n: int, like: torch.Tensor) -> torch.Tensor:
    future = torch.ones(n, n, dtype=torch.bool, device=like.device).triu(1)
    return torch.zeros(n, n, dtype=like.dtype, device=like.device).masked_fill(future, -torch.inf)


class FastObjective:
    """Discounted returns of candidate chunks: sum_s discounts[s] r^_s + tail_discount v^_T.

    `prepare` once per control step (the context and command), then call the prepared step on
    each iteration's candidates (N, T, A) -> (returns (N,), non-finite mask (N,)).
    """

    def __init__(self, model: WorldModel, discounts: torch.Tensor, tail_discount: float):
        if not self.supports(model):
            raise TypeError(f"FastObjective needs a WorldModel, got {type(model).__name__}")
        self.model = model
        self.discounts = discounts
        self.tail_discount = tail_discount

    @staticmethod
    def supports(model) -> bool:
        return isinstance(model, WorldModel) and isinstance(
            model.f, (ChunkedDynamics, AutoregressiveDynamics)
        )

    def prepare(
        self,
        z: torch.Tensor,
        history: torch.Tensor,
        context: ContextCache,
        command: torch.Tensor | None,
    ) -> "PreparedObjective":
        """One step's shared inputs: z (1, D), history (1, 2h, D), f's context of them (batch 1)
        and the raw command (1, C) or None."""
        model = self.model
        t = self.discounts.shape[0]
        commands_n = model._commands_n(command, t + 1, 1)  # (1, T + 1, C) or None
        first = z.unsqueeze(1)
        if model.config.reward_reads_latent_token:
            first = model.history_encoder.latent_token(first)
        return PreparedObjective(
            self,
            z=z,
            history=history,
            context=context,
            cross=tuple(
                SharedCrossAttention.fold(layer.cross_attn, k, v)
                for layer, (k, v) in zip(model.f.decoder.layers, context.keys_values, strict=True)
            ),
            commands_n=commands_n,
            first_reward_token=first,
            mask=_causal_mask(t, z),
        )


@dataclass(frozen=True)
class PreparedObjective:
    objective: FastObjective
    z: torch.Tensor
    history: torch.Tensor
    context: ContextCache
    cross: tuple[SharedCrossAttention, ...]  # f's cross-attention, one per decoder layer
    commands_n: torch.Tensor | None
    first_reward_token: torch.Tensor  # (1, 1, D): the reward head's input at step 0
    mask: torch.Tensor  # (T, T) additive causal mask

    def __call__(self, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        obj = self.objective
        model = obj.model
        n = actions.shape[0]
        actions_n = model.scaler.normalize("actions", actions.float())
        predicted = self.dynamics_n(actions_n)  # (N, T, D)
        rewards = model.scaler.denormalize_scalar("rewards", self.rewards_n(predicted, actions_n))
        last_value = model.scaler.denormalize_scalar("values", self.last_value_n(predicted))
        returns = rewards @ obj.discounts + obj.tail_discount * last_value
        bad = ~(
            torch.isfinite(predicted).view(n, -1).all(1)
            & torch.isfinite(rewards).all(1)
            & torch.isfinite(last_value)
        )
        return returns, bad

    def dynamics_n(self, actions_n: torch.Tensor) -> torch.Tensor:
        f = self.objective.model.f
        queries = f.action_embed(actions_n)
        if isinstance(f, ChunkedDynamics):
            return _decode(f.decoder, queries, self.cross, self.mask)
        z = self.context.tokens[:, -1].expand(actions_n.shape[0], -1)  # autoregressive
        out = []
        for k in range(actions_n.shape[1]):
            x = (queries[:, k] + f.latent_in(z)).unsqueeze(1)
            z = _decode(f.decoder, x, self.cross, None).squeeze(1)
            out.append(z)
        return torch.stack(out, dim=1)

    def _commands(self, n: int, part: slice) -> list[torch.Tensor]:
        if self.commands_n is None:
            return []
        return [self.commands_n[:, part].expand(n, -1, -1)]

    def rewards_n(self, predicted: torch.Tensor, actions_n: torch.Tensor) -> torch.Tensor:
        """Normalised r^_{t..t+T-1} (N, T); the reward head reads [z_t token, z^_{t+1..t+T-1}]."""
        model, n = self.objective.model, predicted.shape[0]
        first = self.first_reward_token.expand(n, -1, -1)
        latents = torch.cat((first, predicted[:, :-1]), dim=1)
        x = torch.cat([latents, actions_n, *self._commands(n, slice(0, -1))], dim=-1)
        head = model.reward_head
        if isinstance(head, TransformerHead):
            return head.out(_encode(head.encoder.layers, head.embed(x))).squeeze(-1)
        return head(x)

    def last_value_n(self, predicted: torch.Tensor) -> torch.Tensor:
        """Normalised v^_{t+T} (N,): the value head's last output."""
        model, n = self.objective.model, predicted.shape[0]
        x = torch.cat([predicted, *self._commands(n, slice(1, None))], dim=-1)
        head = model.value_head
        if isinstance(head, TransformerHead):
            return _head_last(head, x)
        return head(x[:, -1:])[:, 0]
