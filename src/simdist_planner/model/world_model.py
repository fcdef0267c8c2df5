"""The SimDist world model (Eq. 1): E, C, f, R, V, pi behind a raw-units API.

    z_t          = E(o_t)                         encode(obs)
    h_t          = C(o^p_{t-H:t-1}, a_{t-H:t-1})   encode_history(proprio, actions)
    z^_{t+1:t+T} = f(z_t, a_{t:t+T-1}, h_t)        dynamics(z, actions, history)   one pass
                                                   dynamics_context(z, history)    f's K / V, once
    r^_{t:t+T-1} = R(z_{t:t+T}, a_{t:t+T-1})       reward(latents, actions, command)
    v^_{t+1:t+T} = V(z_{t:t+T})                    value(latents, command)
    a^_{t:t+T-1} = pi(z_t, h_t)                    policy(z, history, command)

`latents` is (B, T+1, D): z_t followed by the T predicted latents. Inputs and outputs are in raw
physical units; the fitted scaler (buffers in `self.scaler`) normalises inside. The `_n` methods
work on normalised tensors and are what the losses and the planner's batched paths share.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from simdist_planner.model.config import WorldModelConfig
from simdist_planner.model.encoders import HistoryEncoder, ObservationEncoder
from simdist_planner.model.heads import (
    AutoregressiveDynamics,
    ChunkedDynamics,
    ObservationDecoder,
    PolicyHead,
    make_head,
)
from simdist_planner.model.scaler import Scaler, scaler_dims
from simdist_planner.model.transformers import MLP, ContextCache

# Parameter groups by module name prefix; used by the adapter (train f only) and for reporting.
PARTS = {
    "encoder": ("encoder.",),
    "history": ("history_encoder.",),
    "dynamics": ("f.",),
    "reward": ("reward_head.",),
    "value": ("value_head.",),
    "policy": ("policy_head.",),
    "decoder": ("decoder.",),
    "state": ("state_head.",),
}


def unwrap(model: nn.Module) -> "WorldModel":
    """The WorldModel inside a DistributedDataParallel and/or torch.compile wrapper (or the model
    itself); TypeError for anything else."""
    inner = getattr(model, "module", model)
    inner = getattr(inner, "_orig_mod", inner)
    if not isinstance(inner, WorldModel):
        raise TypeError(f"expected a WorldModel (or one wrapped), got {type(inner).__name__}")
    return inner


def _need(ok: bool, msg: str) -> None:
    if not ok:
        raise ValueError(msg)


class WorldModel(nn.Module):
    def __init__(self, config: WorldModelConfig):
        super().__init__()
        config.validate()
        self.config = config
        d, a, c = config.latent_dim, config.action_dim, config.command_dim
        self.scaler = Scaler(scaler_dims(config), eps=config.numerics.scaler_eps)
        self.encoder = ObservationEncoder(config)
        self.history_encoder = HistoryEncoder(config)
        self.f = (ChunkedDynamics if config.dynamics_kind == "chunked" else AutoregressiveDynamics)(
            config
        )
        self.reward_head = make_head(d + a + c, config, config.reward)
        self.value_head = make_head(d + c, config, config.value)
        self.policy_head = PolicyHead(config)
        self.decoder = ObservationDecoder(config) if config.loss.reconstruction > 0 else None
        # auxiliary privileged-state readout of z (LossWeights.state); training only
        self.state_head = (
            MLP(d, [d * config.encoder_hidden_factor], config.state_dim)
            if config.state_dim
            else None
        )
        # the forward pass's numerics (NumericsConfig); the defaults leave torch's in place
        for module in self.modules():
            if isinstance(module, nn.GELU):
                module.approximate = config.numerics.gelu_approximate
            elif isinstance(module, nn.LayerNorm):
                module.eps = config.numerics.layer_norm_eps

    # ------------------------------------------------------------------ input checking
    def _check_tail(
        self, name: str, x: torch.Tensor, tail: tuple[int, ...], ndim: int | None = None
    ):
        _need(isinstance(x, torch.Tensor), f"{name} must be a torch.Tensor, got {type(x).__name__}")
        ok = tuple(x.shape[x.dim() - len(tail) :]) == tail and x.dim() >= len(tail) + 1
        if ndim is not None:
            ok = ok and x.dim() == ndim
        lead = ["..."] if ndim is None else ["B", "n", "m"][: ndim - len(tail)]
        want = ", ".join(lead + [str(d) for d in tail])
        _need(
            ok,
            f"{self.config.robot} world model: {name} has shape {tuple(x.shape)}, "
            f"expected ({want})",
        )

    def _obs_parts(self, obs: dict):
        """Normalised (proprio, height_map, images) of an observation dict with any leading dims."""
        cfg = self.config
        _need("proprio" in obs, f"observation has no 'proprio'; keys: {sorted(obs)}")
        proprio = obs["proprio"]
        self._check_tail("proprio", proprio, (cfg.proprio_dim,))
        lead_shape = proprio.shape[:-1]
        proprio_n = self.scaler.normalize("proprio", proprio.float())
        hm = images = None
        if cfg.height_map is not None:
            _need("height_map" in obs, f"{cfg.robot} world model needs obs['height_map']")
            hm = obs["height_map"]
            _need(
                tuple(hm.shape) == (*lead_shape, *cfg.height_map.shape),
                f"height_map has shape {tuple(hm.shape)}, "
                f"expected {(*lead_shape, *cfg.height_map.shape)}",
            )
            hm = self.scaler.normalize("height_map", hm.float())
        if cfg.image is not None:
            _need("images" in obs, f"{cfg.robot} world model needs obs['images']")
            images = obs["images"]
            _need(
                images.dim() == len(lead_shape) + 4
                and tuple(images.shape[: len(lead_shape) + 2]) == (*lead_shape, cfg.num_cameras, 3),
                f"images have shape {tuple(images.shape)}, expected "
                f"{(*lead_shape, cfg.num_cameras, 3)} + (h, w)",
            )
        return proprio_n, hm, images

    def _encode_n(self, proprio_n, hm, images) -> torch.Tensor:
        lead = proprio_n.shape[:-1]
        flat = lambda x: None if x is None else x.reshape(-1, *x.shape[len(lead) :])  # noqa: E731
        z = self.encoder(flat(proprio_n), flat(hm), flat(images))
        return z.reshape(*lead, -1)

    def _commands_n(self, command, steps: int, batch: int):
        """(B, C) or (B, >= steps, C) raw commands -> normalised (B, steps, C); None without one."""
        c = self.config.command_dim
        if c == 0:
            return None
        _need(command is not None, f"{self.config.robot} world model needs the command (B, {c})")
        _need(
            command.dim() in (2, 3) and command.shape[0] == batch and command.shape[-1] == c,
            f"command has shape {tuple(command.shape)}, "
            f"expected ({batch}, {c}) or ({batch}, {steps}, {c})",
        )
        command = self.scaler.normalize("command", command.float())
        if command.dim() == 2:
            return command.unsqueeze(1).expand(batch, steps, c)
        _need(command.shape[1] >= steps, f"command has {command.shape[1]} steps, need {steps}")
        return command[:, :steps]

    # ------------------------------------------------------------------ normalised internals
    def history_n(self, proprio_n: torch.Tensor, actions_n: torch.Tensor) -> torch.Tensor:
        return self.history_encoder(self.encoder.proprio(proprio_n), actions_n)

    def context(self, z: torch.Tensor, history: torch.Tensor) -> torch.Tensor:
        return torch.cat((history, self.history_encoder.latent_token(z).unsqueeze(1)), dim=1)

    def dynamics_n(
        self, z, actions_n, history, context: ContextCache | None = None
    ) -> torch.Tensor:
        return self.f(actions_n, self.context(z, history) if context is None else context)

    def reward_n(self, latents, actions_n, commands_n) -> torch.Tensor:
        inputs = latents[:, :-1]
        if self.config.reward_reads_latent_token:  # z_t as the context's z_t token (official)
            first = self.history_encoder.latent_token(inputs[:, :1])
            inputs = torch.cat((first, inputs[:, 1:]), dim=1)
        x = [inputs, actions_n] + ([] if commands_n is None else [commands_n[:, :-1]])
        return self.reward_head(torch.cat(x, dim=-1))

    def value_n(self, latents, commands_n) -> torch.Tensor:
        x = [latents[:, 1:]] + ([] if commands_n is None else [commands_n[:, 1:]])
        return self.value_head(torch.cat(x, dim=-1))

    def policy_n(self, z, history, commands_n, steps: int, proprio_n=None) -> torch.Tensor:
        return self.policy_head(self.context(z, history), commands_n, steps, proprio_n)

    # ------------------------------------------------------------------ public API, raw units
    def encode(self, obs: dict) -> torch.Tensor:
        """Observation dict (proprio (B, P), images, height_map) -> z (B, D)."""
        return self._encode_n(*self._obs_parts(obs))

    def encode_history(self, proprio: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """proprio (B, h, P) and actions (B, h, A), h <= H -> history tokens (B, 2h, D)."""
        self._check_tail("history proprio", proprio, (self.config.proprio_dim,), 3)
        self._check_tail("history actions", actions, (self.config.action_dim,), 3)
        _need(
            proprio.shape[:2] == actions.shape[:2],
            f"history proprio {tuple(proprio.shape)} and actions {tuple(actions.shape)} "
            "differ in (B, h)",
        )
        return self.history_n(
            self.scaler.normalize("proprio", proprio.float()),
            self.scaler.normalize("actions", actions.float()),
        )

    def dynamics_context(self, z: torch.Tensor, history: torch.Tensor) -> ContextCache:
        """z (B, D), history (B, 2h, D) -> f's cross-attention keys / values of their context.

        Computed once and passed as `dynamics(..., context=)`, it spares every further call on
        the same z and history (the planner's candidates and iterations) the K / V projections;
        at batch 1 it serves any number of action sequences.
        """
        self._check_inputs(z, history)
        return self.f.decoder.cache(self.context(z, history))

    def dynamics(
        self,
        z: torch.Tensor,
        actions: torch.Tensor,
        history: torch.Tensor,
        context: ContextCache | None = None,
    ) -> torch.Tensor:
        """z (B, D), actions (B, T, A), history (B, 2h, D) -> predicted latents (B, T, D).

        `context`: `dynamics_context(z, history)` of these z and history (batch 1 or B); when
        given, it is used instead of recomputing the context from z and history.
        """
        self._check_inputs(z, history)
        self._check_tail("actions", actions, (self.config.action_dim,), 3)
        if context is not None:
            _need(
                context.tokens.shape[0] in (1, z.shape[0]),
                f"dynamics context batch {context.tokens.shape[0]} is neither 1 "
                f"nor z batch {z.shape[0]}",
            )
        return self.dynamics_n(
            z, self.scaler.normalize("actions", actions.float()), history, context
        )

    def reward(self, latents: torch.Tensor, actions: torch.Tensor, command=None) -> torch.Tensor:
        """latents (B, T+1, D) = [z_t, z^_{t+1..t+T}], actions (B, T, A) -> r^_{t..t+T-1} (B, T)."""
        self._check_tail("latents", latents, (self.config.latent_dim,), 3)
        self._check_tail("actions", actions, (self.config.action_dim,), 3)
        b, t1 = latents.shape[:2]
        _need(
            actions.shape[:2] == (b, t1 - 1),
            f"reward: latents {tuple(latents.shape)} need actions ({b}, {t1 - 1}, A), "
            f"got {tuple(actions.shape)}",
        )
        r = self.reward_n(
            latents,
            self.scaler.normalize("actions", actions.float()),
            self._commands_n(command, t1, b),
        )
        return self.scaler.denormalize_scalar("rewards", r)

    def value(self, latents: torch.Tensor, command=None) -> torch.Tensor:
        """latents (B, T+1, D) = [z_t, z^_{t+1..t+T}] -> v^_{t+1..t+T} (B, T)."""
        self._check_tail("latents", latents, (self.config.latent_dim,), 3)
        b, t1 = latents.shape[:2]
        return self.scaler.denormalize_scalar(
            "values", self.value_n(latents, self._commands_n(command, t1, b))
        )

    def policy(
        self, z: torch.Tensor, history: torch.Tensor, command=None, proprio=None
    ) -> torch.Tensor:
        """z (B, D), history (B, 2h, D) [, command] [, proprio o^p_t (B, P), needed with
        policy_proprio_skip] -> action chunk a^_{t..t+T-1} (B, T, A)."""
        self._check_inputs(z, history)
        commands = self._commands_n(command, self.config.horizon, z.shape[0])
        proprio_n = None
        if self.config.policy_reads_proprio:
            _need(
                proprio is not None,
                f"{self.config.robot} world model: pi reads the proprio; pass proprio (B, P)",
            )
            self._check_tail("proprio", proprio, (self.config.proprio_dim,), 2)
            _need(
                proprio.shape[0] == z.shape[0],
                f"proprio batch {proprio.shape[0]} != z batch {z.shape[0]}",
            )
            proprio_n = self.scaler.normalize("proprio", proprio.float())
        steps = self.config.horizon
        return self.scaler.denormalize(
            "actions", self.policy_n(z, history, commands, steps, proprio_n)
        )

    def state(self, z: torch.Tensor) -> torch.Tensor:
        """z (B, D) -> the privileged task state the state head reads from it (B, S), raw units:
        how much of the task state the latent holds (diagnostics; planning never uses it)."""
        if self.state_head is None:
            raise ValueError(f"{self.config.robot} world model has no state head (state_dim 0)")
        self._check_tail("z", z, (self.config.latent_dim,), 2)
        return self.scaler.denormalize("state", self.state_head(z))

    def _check_inputs(self, z, history):
        d = self.config.latent_dim
        self._check_tail("z", z, (d,), 2)
        self._check_tail("history", history, (d,), 3)
        _need(
            history.shape[0] == z.shape[0],
            f"history batch {history.shape[0]} != z batch {z.shape[0]}",
        )

    # ------------------------------------------------------------------ training window
    def forward(self, window: dict) -> dict[str, Any]:
        """Training forward = `predict_window`, so DistributedDataParallel can wrap the model."""
        return self.predict_window(window)

    def predict_window(self, window: dict) -> dict[str, Any]:
        """Normalised predictions and targets for one training window (docs/architecture.md).

        Target latents E(o_{t+1..t+T}) come from a second encoder pass without autograd (the
        stop-gradient of Eq. 2; a ResNet's BatchNorm therefore sees z_t's batch and the targets'
        batch separately). Observations may sit at the top level of `window` or under
        `window["obs"]` (the dataset's WindowDataset items).
        """
        obs = window.get("obs", window)
        actions, rewards = window["actions"], window["rewards"]
        self._check_tail("window actions", actions, (self.config.action_dim,), 3)
        _need(rewards.dim() == 2, f"window rewards must be (B, T), got {tuple(rewards.shape)}")
        b, t = rewards.shape
        h = actions.shape[1] - t
        _need(
            h >= 0 and actions.shape[0] == b,
            f"window actions {tuple(actions.shape)} do not fit rewards (B, T) = {(b, t)}",
        )
        _need(
            "proprio" in obs and obs["proprio"].shape[:2] == (b, h + t + 1),
            f"window proprio must have (B, H + T + 1) = {(b, h + t + 1)} leading dims",
        )
        proprio_n, hm, images = self._obs_parts(obs)
        actions_n = self.scaler.normalize("actions", actions.float())
        history = self.history_n(proprio_n[:, :h], actions_n[:, :h])
        now = lambda x: None if x is None else x[:, h : h + 1]  # noqa: E731
        future = lambda x: None if x is None else x[:, h + 1 :]  # noqa: E731
        z = self._encode_n(proprio_n[:, h : h + 1], now(hm), now(images))[:, 0]
        with torch.no_grad():  # sg(E(o_{t+1..t+T})): no graph, so backward skips T of T + 1 rows
            target = self._encode_n(proprio_n[:, h + 1 :], future(hm), future(images))
        commands = None
        if self.config.command_dim:
            _need("command" in obs, f"{self.config.robot} window needs 'command' (B, H + T + 1, C)")
            commands = self._commands_n(obs["command"][:, h:], t + 1, b)
        pred = self.dynamics_n(z, actions_n[:, h:], history)
        latents = torch.cat((z.unsqueeze(1), pred), dim=1)
        # tensors by name, and with a decoder the name -> tensor dicts "reconstruction" and
        # "reconstruction_targets"
        out: dict[str, Any] = {
            "latents": pred,
            "target_latents": target,
            "rewards": self.reward_n(latents, actions_n[:, h:], commands),
            "values": self.value_n(latents, commands),
            "actions": self.policy_n(z, history, commands, t, proprio_n[:, h]),
        }
        if self.state_head is not None:
            out["state"] = self.state_head(z)
        if self.decoder is not None:
            out["reconstruction"] = self.decoder(latents)
            out["reconstruction_targets"] = self._reconstruction_targets(
                proprio_n[:, h:], *(None if x is None else x[:, h:] for x in (hm, images))
            )
        return out

    def _reconstruction_targets(self, proprio_n, hm, images) -> dict[str, torch.Tensor]:
        lead = proprio_n.shape[:-1]
        targets = {"proprio": proprio_n}
        if hm is not None:
            targets["height_map"] = hm.reshape(*lead, -1)
        if images is not None:
            r = self.config.reconstruction_image_size
            assert self.encoder.images is not None  # images are read only by a model with cameras
            x = self.encoder.images.preprocess(images.reshape(-1, *images.shape[len(lead) :]))
            x = F.adaptive_avg_pool2d(x, r)
            targets["images"] = x.reshape(*lead, -1)
        return targets

    # ------------------------------------------------------------------ bookkeeping
    def part_of(self, name: str) -> str:
        for part, prefixes in PARTS.items():
            if name.startswith(prefixes):
                return part
        return "scaler"

    def parameter_counts(self) -> dict[str, int]:
        counts = {part: 0 for part in PARTS}
        for name, p in self.named_parameters():
            counts[self.part_of(name)] += p.numel()
        counts["total"] = sum(counts.values())
        return counts
