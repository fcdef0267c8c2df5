"""The planner's objective on the inference fast path: the same f, R and V as the eager
`WorldModel` calls, with the same weights, arranged for throughput at planning batch sizes.

MPPI scores hundreds of candidate chunks per iteration (official Go2: 472 x 25 tokens), and on
a CPU the eager modules spend most of that time outside the arithmetic that matters
(docs/planner.md, "Where a plan's time goes"). What this path does differently, and why each
step is exact up to float rounding:

- Attention with head dimensions of 8-16 and 25-51 keys runs as batched matmuls on one
  contiguous (batch x heads) layout with an additive causal mask, not through
  `scaled_dot_product_attention`, whose CPU kernel is 2-3x slower at these sizes. q, k and v
  come from one projection with the three weight matrices stacked (the 1 / sqrt(d) scale in
  q's), read from the modules at every call, so a model updated in place is never stale.
- Cross-attention to the context: its keys / values are shared by every candidate (batch 1,
  `WorldModel.dynamics_context`), so every candidate's tokens attend to them in one batched
  matmul per head (`SharedCrossAttention`), with the keys transposed and scaled once per step.
- The return reads only the last predicted value, so V's final layer computes its query,
  feed-forward and output for the last token alone (the keys and values of every token are
  still computed; attention is unmasked, so the last token sees all of them).
- Actions are normalised once for f and R; the command's tokens are normalised once per step.
- On CPU each Linear (+ GELU) is one oneDNN call (`linear`), and softmax over rows shorter than
  SHORT_ROW is computed by hand (`_softmax_rows`): both measured faster than torch's defaults at
  these shapes.

`FastObjective(dtype=torch.bfloat16)` (PlannerConfig.precision) runs f, R and V on a bfloat16
copy of their weights, refreshed from the model at every `prepare`, with bfloat16 activations;
the inputs are normalised and the heads' scalar outputs computed in float32, and its attention
weights are formed without the row maximum (`_attend`). It is not exact: its bound against the
float32 reference is stated in docs/planner.md and tested.

Models outside this layout (MLP heads, any other decoder) are scored through the model's own
methods for the parts that differ; `FastObjective.supports` says whether a model can use it.
The eager path (`MPPIPlanner` with `evaluator="eager"`) stays the reference: tests compare the
two on the same candidates (returns, elite sets, the executed action).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TypeGuard

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
    """oneDNN's fused linear (+ activation) kernels: CPU float32 or bfloat16 (mkldnn build)."""
    return (
        x.device.type == "cpu"
        and x.dtype in (torch.float32, torch.bfloat16)
        # a bool at run time; typed as the ContextProp that makes the module attribute settable
        and bool(torch.backends.mkldnn.enabled)
    )


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
# The smallest weight sum `_attend` accepts from an unshifted exp: a row whose largest score is
# below about -69 (or NaN, or an overflow) sends the call to the shifted form.
TINY_ROW_SUM = 1e-30


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


def _attend(q: torch.Tensor, k_t: torch.Tensor, v: torch.Tensor, mask) -> torch.Tensor:
    """softmax(q k_t + mask) v for batched q (B, n, d), k_t (B, d, m) and v (B, m, d), the
    scale 1 / sqrt(d) already in q or k_t: (B, n, d).

    float32 (the precision the eager reference runs in): the scores' softmax, then v.
    bfloat16 on CPU: torch's softmax and row reductions on bfloat16 rows of 25-51 keys cost
    more than the rest of the attention, so the weights are exp(score) without the row maximum
    subtracted (softmax does not change under that shift) and never normalised themselves: v
    gets a column of ones, the one matmul returns each row's output and its weight sum, and the
    output is divided by the sum (d values a row instead of m). A call with a row sum that is
    not finite or below TINY_ROW_SUM (a score beyond exp's range, or NaN) is recomputed with
    the maximum subtracted, as is every call on other devices (no host sync there).
    """
    scores = torch.bmm(q, k_t) if mask is None else torch.baddbmm(mask, q, k_t)
    if scores.dtype == torch.float32:
        return torch.bmm(_softmax_rows(scores, scores.shape[-1]), v)
    v1 = torch.cat((v, v.new_ones(*v.shape[:-1], 1)), dim=-1)
    if scores.device.type == "cpu":
        o = torch.bmm(scores.exp(), v1)
        low, high = torch.aminmax(o[..., -1])  # one pass (amin and amax on bf16: 40x slower)
        if bool((low >= TINY_ROW_SUM) & (high < torch.inf)):
            return o[..., :-1] / o[..., -1:]
    o = torch.bmm((scores - scores.amax(-1, keepdim=True)).exp_(), v1)
    return o[..., :-1] / o[..., -1:]


def _heads(attn: Attention, dim: int) -> tuple[int, int]:
    return attn.heads, dim // attn.heads


def _split_heads(y: torch.Tensor, h: int, d: int, transpose: bool = False) -> torch.Tensor:
    """(B, n, h * d) -> (B h, n, d) contiguous, or (B h, d, n) with `transpose`."""
    b, n, _ = y.shape
    y = y.reshape(b, n, h, d)
    return (y.permute(0, 2, 3, 1) if transpose else y.transpose(1, 2)).reshape(
        b * h, *((d, n) if transpose else (n, d))
    )


def self_attention(attn: Attention, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """`attn(x, x, causal)` in inference: `mask` (n, n) is the additive causal mask, or None for
    unmasked attention. q, k and v come from one projection with the three weight matrices
    stacked (the scale 1 / sqrt(d) folded into q's)."""
    b, n, dim = x.shape
    h, d = _heads(attn, dim)
    scale = d**-0.5
    weight = torch.cat((attn.q.weight * scale, attn.k.weight, attn.v.weight))
    bias = torch.cat((attn.q.bias * scale, attn.k.bias, attn.v.bias))
    q, k, v = linear(x, weight, bias).split(dim, dim=-1)
    y = _attend(_split_heads(q, h, d), _split_heads(k, h, d, True), _split_heads(v, h, d), mask)
    return linear(
        y.view(b, h, n, d).transpose(1, 2).reshape(b, n, dim), attn.out.weight, attn.out.bias
    )


def last_token_attention(attn: Attention, x: torch.Tensor) -> torch.Tensor:
    """The last token's row of unmasked `attn(x, x)`: (B, n, D) -> (B, 1, D)."""
    b, n, dim = x.shape
    h, d = _heads(attn, dim)
    k, v = linear(
        x, torch.cat((attn.k.weight, attn.v.weight)), torch.cat((attn.k.bias, attn.v.bias))
    ).split(dim, dim=-1)
    q = linear(x[:, -1:], attn.q.weight * d**-0.5, attn.q.bias * d**-0.5).view(b * h, 1, d)
    y = _attend(q, _split_heads(k, h, d, True), _split_heads(v, h, d), None)
    return linear(y.view(b, 1, dim), attn.out.weight, attn.out.bias)


@dataclass(frozen=True)
class SharedCrossAttention:
    """One layer's cross-attention to a context shared by every query (batch 1 keys and values,
    `WorldModel.dynamics_context`): all candidates' tokens attend as one (heads, B n, d) batch
    to the keys, transposed and scaled once per step."""

    attn: Attention
    k_t: torch.Tensor  # (heads, d, m): keys^T / sqrt(d)
    v: torch.Tensor  # (heads, m, d)

    @classmethod
    def of(cls, attn: Attention, k: torch.Tensor, v: torch.Tensor, dtype: torch.dtype):
        """`k`, `v`: the context's per-head keys / values (1, heads, m, d) (`ContextCache`),
        prepared in float32 and then cast to `dtype`."""
        d = k.shape[-1]
        k_t = (k[0] * d**-0.5).transpose(1, 2).contiguous()
        return cls(attn, k_t.to(dtype), v[0].to(dtype))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Queries `x` (B, n, D) -> the attention output (B, n, D)."""
        b, n, dim = x.shape
        h, d = _heads(self.attn, dim)
        q = linear(x, self.attn.q.weight, self.attn.q.bias).view(b * n, h, d).transpose(0, 1)
        y = _attend(q, self.k_t, self.v, None)  # (heads, B n, d)
        y = y.transpose(0, 1).reshape(b, n, dim)
        return linear(y, self.attn.out.weight, self.attn.out.bias)


def _decode(decoder: TransformerDecoder, x, cross: tuple[SharedCrossAttention, ...], mask):
    for layer, cross_attention in zip(decoder.layers, cross, strict=True):
        assert isinstance(layer, DecoderLayer)  # nn.ModuleList items are typed nn.Module
        x = layer.norm1(x + self_attention(layer.self_attn, x, mask))
        x = layer.norm2(x + cross_attention(x))
        x = layer.norm3(x + mlp(layer.mlp, x))
    return x


def _encode(layers, x: torch.Tensor) -> torch.Tensor:
    for layer in layers:
        assert isinstance(layer, EncoderLayer)  # nn.ModuleList items are typed nn.Module
        x = layer.norm1(x + self_attention(layer.attn, x, None))
        x = layer.norm2(x + mlp(layer.mlp, x))
    return x


def _head_last(head: TransformerHead, x: torch.Tensor) -> torch.Tensor:
    """A seq2seq head's features for the last token only, before `out`: (B, n, in) -> (B, D)."""
    x = _encode(head.encoder.layers[:-1], head.embed(x))
    last = head.encoder.layers[-1]
    assert isinstance(last, EncoderLayer)
    y = last.norm1(x[:, -1:] + last_token_attention(last.attn, x))
    return last.norm2(y + mlp(last.mlp, y))[:, 0]


def _out(module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """A head's scalar output layer in float32, whatever the precision of its input features: a
    bfloat16 output would carry 8 bits, the largest share of a bfloat16 return's error."""
    return F.linear(x.float(), module.weight, module.bias).squeeze(-1)


def _causal_mask(n: int, like: torch.Tensor) -> torch.Tensor:
    future = torch.ones(n, n, dtype=torch.bool, device=like.device).triu(1)
    return torch.zeros(n, n, dtype=like.dtype, device=like.device).masked_fill(future, -torch.inf)


class FastObjective:
    """Discounted returns of candidate chunks: sum_s discounts[s] r^_s + tail_discount v^_T.

    `prepare` once per control step (the context and command), then call the prepared step on
    each iteration's candidates (N, T, A) -> (returns (N,), non-finite mask (N,)).
    """

    def __init__(
        self,
        model: WorldModel,
        discounts: torch.Tensor,
        tail_discount: float,
        dtype: torch.dtype = torch.float32,
    ):
        if not self.supports(model):
            raise TypeError(f"FastObjective needs a WorldModel, got {type(model).__name__}")
        self.model = model
        self.discounts = discounts
        self.tail_discount = tail_discount
        self.dtype = dtype
        # f, R and V in the compute dtype: the model's own modules in float32, otherwise a copy
        # whose weights are refreshed from the model at every `prepare`.
        self._sources = nn.ModuleList([model.f, model.reward_head, model.value_head])
        self._heads = (
            self._sources if dtype == torch.float32 else copy.deepcopy(self._sources).to(dtype)
        )

    def _refresh(self) -> tuple[ChunkedDynamics | AutoregressiveDynamics, nn.Module, nn.Module]:
        if self._heads is not self._sources:
            for s, p in zip(self._heads.parameters(), self._sources.parameters(), strict=True):
                s.copy_(p)
        f, reward_head, value_head = self._heads
        assert isinstance(f, (ChunkedDynamics, AutoregressiveDynamics))  # supports() checked it
        return f, reward_head, value_head

    @staticmethod
    def supports(model) -> TypeGuard[WorldModel]:
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
        model, dtype = self.model, self.dtype
        f, reward_head, value_head = self._refresh()
        t = self.discounts.shape[0]
        commands_n = model._commands_n(command, t + 1, 1)  # (1, T + 1, C) or None
        first = z.unsqueeze(1)
        if model.config.reward_reads_latent_token:
            first = model.history_encoder.latent_token(first)
        cross = []
        for layer, (k, v) in zip(f.decoder.layers, context.keys_values, strict=True):
            assert isinstance(layer, DecoderLayer)  # nn.ModuleList items are typed nn.Module
            cross.append(SharedCrossAttention.of(layer.cross_attn, k, v, dtype))
        return PreparedObjective(
            self,
            f=f,
            reward_head=reward_head,
            value_head=value_head,
            context_latent=context.tokens[:, -1].to(dtype),
            cross=tuple(cross),
            commands_n=None if commands_n is None else commands_n.to(dtype),
            first_reward_token=first.to(dtype),
            mask=_causal_mask(t, z).to(dtype),
        )


@dataclass(frozen=True)
class PreparedObjective:
    objective: FastObjective
    f: ChunkedDynamics | AutoregressiveDynamics  # f, R and V in the objective's dtype
    reward_head: nn.Module
    value_head: nn.Module
    context_latent: torch.Tensor  # (1, D): the context's last token (autoregressive f's z_t)
    cross: tuple[SharedCrossAttention, ...]  # f's cross-attention, one per decoder layer
    commands_n: torch.Tensor | None
    first_reward_token: torch.Tensor  # (1, 1, D): the reward head's input at step 0
    mask: torch.Tensor  # (T, T) additive causal mask

    def __call__(self, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        obj = self.objective
        model = obj.model
        n = actions.shape[0]
        actions_n = model.scaler.normalize("actions", actions.float()).to(obj.dtype)
        predicted = self.dynamics_n(actions_n)  # (N, T, D)
        rewards_n = self.rewards_n(predicted, actions_n).float()
        rewards = model.scaler.denormalize_scalar("rewards", rewards_n)
        last_value = model.scaler.denormalize_scalar("values", self.last_value_n(predicted).float())
        returns = rewards @ obj.discounts + obj.tail_discount * last_value
        bad = ~(
            torch.isfinite(predicted).view(n, -1).all(1)
            & torch.isfinite(rewards).all(1)
            & torch.isfinite(last_value)
        )
        return returns, bad

    def dynamics_n(self, actions_n: torch.Tensor) -> torch.Tensor:
        f = self.f
        queries = f.action_embed(actions_n)
        if isinstance(f, ChunkedDynamics):
            return _decode(f.decoder, queries, self.cross, self.mask)
        z = self.context_latent.expand(actions_n.shape[0], -1)  # autoregressive
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
        n = predicted.shape[0]
        first = self.first_reward_token.expand(n, -1, -1)
        latents = torch.cat((first, predicted[:, :-1]), dim=1)
        x = torch.cat([latents, actions_n, *self._commands(n, slice(0, -1))], dim=-1)
        head, source = self.reward_head, self.objective.model.reward_head
        if isinstance(head, TransformerHead):
            assert isinstance(source, TransformerHead)  # head is source or its copy
            return _out(source.out, _encode(head.encoder.layers, head.embed(x)))
        return head(x)

    def last_value_n(self, predicted: torch.Tensor) -> torch.Tensor:
        """Normalised v^_{t+T} (N,): the value head's last output."""
        n = predicted.shape[0]
        x = torch.cat([predicted, *self._commands(n, slice(1, None))], dim=-1)
        head, source = self.value_head, self.objective.model.value_head
        if isinstance(head, TransformerHead):
            assert isinstance(source, TransformerHead)  # head is source or its copy
            return _out(source.out, _head_last(head, x))
        return head(x[:, -1:])[:, 0]
