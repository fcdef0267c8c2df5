"""Typed world-model configuration, saved inside every checkpoint as JSON.

`go2_config()` and `ur5e_config()` reproduce the official SimDist models; `ur5e_small_config()`
is the CPU-sized UR5e model (small CNN at 64x64) used for pretraining on this machine.
`WorldModelConfig.to_dict()` / `from_dict()` round-trip exactly and reject unknown or missing keys,
so a checkpoint written by another version fails loudly instead of building a different network.
"""

from __future__ import annotations

import copy
import dataclasses
import typing
from dataclasses import dataclass, field

CONFIG_FORMAT_VERSION = 1

DYNAMICS_KINDS = ("chunked", "autoregressive")
HEAD_KINDS = ("transformer", "mlp")
IMAGE_BACKBONES = ("resnet18", "small_cnn")
SMALL_BACKBONES = ("small_cnn",)  # trained from scratch at the rendered size
GELU_APPROXIMATIONS = ("none", "tanh")
CONV_PADDINGS = ("symmetric", "same")


@dataclass(frozen=True)
class AttentionConfig:
    """One transformer stack: `layers` x `heads`, MLP width `mlp_factor` x latent."""

    layers: int
    heads: int
    mlp_factor: int = 4


@dataclass(frozen=True)
class ImageEncoderConfig:
    """Per-camera image encoder. Images are resized to (height, width) inside the model."""

    cameras: tuple[str, ...]
    height: int
    width: int
    # "resnet18" (ImageNet layout, 512 features) or "small_cnn" (flattened conv features)
    backbone: str = "resnet18"
    weights_path: str = (
        ""  # local torchvision ResNet-18 weights (.safetensors or .pth); "" = random
    )
    small_cnn_channels: tuple[int, ...] = (16, 32, 64, 64)  # 3x3 convs, stride 2
    small_cnn_features: int = 128  # small-CNN output features per camera


@dataclass(frozen=True)
class HeightMapEncoderConfig:
    """Height-map CNN (official Go2: 8/16/32 channels, stride 2, 3x3) plus an MLP projection."""

    shape: tuple[int, int] = (21, 15)
    channels: tuple[int, ...] = (8, 16, 32)
    strides: tuple[int, ...] = (2, 2, 2)
    kernel_size: int = 3
    projection_hidden: tuple[int, ...] = (192, 128)
    # "symmetric": every conv pads kernel_size // 2 on each side; "same": TF / flax 'SAME' (pad
    # total max((ceil(n / s) - 1) s + k - n, 0), the odd pixel at the end), as the official CNN.
    # They differ wherever a stride-2 conv meets an even size (8 -> 4, 6 -> 3, 4 -> 2 here).
    padding: str = "symmetric"
    # Rotate the (normalised) map by 180 degrees before the CNN. The official model restores the
    # flat scan as flipud(fliplr(.)) of the project's `scan_to_grid` layout.
    flip: bool = False


@dataclass(frozen=True)
class NumericsConfig:
    """Numerics of the forward pass. The defaults are torch's; `OFFICIAL_NUMERICS` are those of the
    official (flax) model, for imported weights: jax.nn.gelu's tanh approximation in every GELU,
    LayerNorm epsilon 1e-6, and a scaler that normalises by (std + 1e-8) (it unscales by std).
    """

    gelu_approximate: str = "none"  # "none" (exact erf) or "tanh"
    layer_norm_eps: float = 1e-5
    scaler_eps: float = 0.0


OFFICIAL_NUMERICS = NumericsConfig(gelu_approximate="tanh", layer_norm_eps=1e-6, scaler_eps=1e-8)


@dataclass(frozen=True)
class LossWeights:
    """Eq. 2 weights on scaler-normalised targets (official: 1 / 1 / 1 / 4); reconstruction off.

    `state` (not in the paper) weighs an auxiliary loss that predicts the simulator's privileged
    task state (object relative to hand and hole, grasp) from z_t. The paper's UR5e encoder
    starts from ImageNet ResNet-18 features; a small CNN trained from scratch on Eq. 2 alone
    learned a latent blind to the peg (docs/world_model.md), so the small UR5e model uses it.
    """

    latent: float = 1.0
    reward: float = 1.0
    value: float = 1.0
    action: float = 4.0
    reconstruction: float = 0.0
    state: float = 0.0


@dataclass(frozen=True)
class WorldModelConfig:
    """Everything needed to rebuild a world model; one source of truth for its shapes."""

    robot: str  # "go2" or "ur5e": the RobotSpec whose observations and actions the model takes
    proprio_dim: int  # P, size of the proprio vector o^p
    action_dim: int  # A, size of one action
    command_dim: int  # C, size of the command (Go2 velocity command; 0 = none)
    history: int  # H, past steps C encodes
    horizon: int  # T, steps f, R, V and pi predict
    latent_dim: int = 64  # D, size of z and of every transformer token
    encoder_hidden_factor: int = 2  # encoder MLP width = factor x latent
    proprio_layers: int = 2  # hidden layers of E's proprio MLP (official 2)
    action_layers: int = 0  # hidden layers of C's action embedding (official 0: linear)
    latent_layers: int = 2  # hidden layers of E's fusing latent MLP (official 2)
    # LayerNorm on z: keeps E's targets on the scale of f's LayerNorm outputs. Without it the
    # UR5e image encoder's latents grew to norm ~50 (predictions ~8) within 250 steps and the
    # latent loss rose tenfold. Not in the official model (checkpoints without the key: False).
    normalize_latent: bool = True
    image: ImageEncoderConfig | None = None  # the cameras' encoder (UR5e); None = no cameras
    height_map: HeightMapEncoderConfig | None = None  # the height map's (Go2); None = none
    dynamics: AttentionConfig = AttentionConfig(2, 8)  # f's transformer
    reward: AttentionConfig = AttentionConfig(1, 4)  # R's (head_kind "transformer")
    value: AttentionConfig = AttentionConfig(1, 4)  # V's (head_kind "transformer")
    policy: AttentionConfig = AttentionConfig(4, 8)  # pi's decoder
    # A zero-initialised linear map from the current normalised proprio to pi's chunk, added to
    # its decoder's output. UR5e actions are deltas on the measured TCP pose, so near a fixed
    # target the action depends on the TCP position, which E's latent holds only to ~15 mm
    # against the peg hole's 1 mm clearance. Not in the paper (False); ur5e_small_config sets it.
    # Measured on the peg (together with the at_hole phase weighting): pi's mean return on Peg
    # Wide rose from 68.2 to 89.0 (docs/notebook/peg_wide.md).
    policy_proprio_skip: bool = False
    dynamics_kind: str = "chunked"  # "chunked" (one pass for T steps) or "autoregressive"
    head_kind: str = "transformer"  # reward / value: "transformer" (seq2seq) or "mlp" (per step)
    mlp_head_hidden_factor: int = 4  # per-step MLP head width = factor x latent
    dropout_mlp: float = 0.2  # dropout probability after each hidden MLP activation
    dropout_attention: float = 0.05  # dropout probability on the attention weights
    numerics: NumericsConfig = NumericsConfig()  # torch's; OFFICIAL_NUMERICS for imported weights
    # R's first input step reads the context's z_t token (z_t + temporal[H] + type[latent], the
    # official encoding["latent"]) instead of the bare z_t; later steps read f's latents either way.
    reward_reads_latent_token: bool = False
    loss: LossWeights = field(default_factory=LossWeights)  # Eq. 2 weights
    reconstruction_image_size: int = 16  # decoder target resolution per camera (reconstruction > 0)
    # Size of the privileged task state the state head predicts (loss.state); 0 = no head. Set
    # from the dataset layout by pretraining, never read at inference.
    state_dim: int = 0

    def __post_init__(self) -> None:
        self.validate()

    @property
    def policy_reads_proprio(self) -> bool:
        """pi's chunk depends on o^p_t directly (policy_proprio_skip)."""
        return self.policy_proprio_skip

    def validate(self) -> None:
        """Raise ValueError naming the first setting that cannot build a model."""

        def need(ok: bool, msg: str) -> None:
            if not ok:
                raise ValueError(f"WorldModelConfig({self.robot!r}): {msg}")

        for name in (
            "proprio_dim",
            "action_dim",
            "history",
            "horizon",
            "latent_dim",
            "encoder_hidden_factor",
            "mlp_head_hidden_factor",
        ):
            need(getattr(self, name) >= 1, f"{name} must be >= 1, got {getattr(self, name)}")
        for name in (
            "command_dim",
            "proprio_layers",
            "action_layers",
            "latent_layers",
            "state_dim",
        ):
            need(getattr(self, name) >= 0, f"{name} must be >= 0, got {getattr(self, name)}")
        need(
            self.dynamics_kind in DYNAMICS_KINDS,
            f"dynamics_kind must be one of {DYNAMICS_KINDS}, got {self.dynamics_kind!r}",
        )
        need(
            self.head_kind in HEAD_KINDS,
            f"head_kind must be one of {HEAD_KINDS}, got {self.head_kind!r}",
        )
        for name in ("dynamics", "reward", "value", "policy"):
            att: AttentionConfig = getattr(self, name)
            need(
                att.layers >= 1 and att.heads >= 1 and att.mlp_factor >= 1,
                f"{name} attention needs layers, heads, mlp_factor >= 1, got {att}",
            )
            need(
                self.latent_dim % att.heads == 0,
                f"latent_dim {self.latent_dim} is not divisible by {name}.heads {att.heads}",
            )
        for name in ("dropout_mlp", "dropout_attention"):
            need(0.0 <= getattr(self, name) < 1.0, f"{name} must be in [0, 1)")
        num = self.numerics
        need(
            num.gelu_approximate in GELU_APPROXIMATIONS,
            f"numerics.gelu_approximate must be one of {GELU_APPROXIMATIONS}, "
            f"got {num.gelu_approximate!r}",
        )
        need(
            num.layer_norm_eps > 0.0,
            f"numerics.layer_norm_eps must be > 0, got {num.layer_norm_eps}",
        )
        need(num.scaler_eps >= 0.0, f"numerics.scaler_eps must be >= 0, got {num.scaler_eps}")
        for name in ("latent", "reward", "value", "action", "reconstruction", "state"):
            need(getattr(self.loss, name) >= 0.0, f"loss weight {name} must be >= 0")
        if self.image is not None:
            need(len(self.image.cameras) >= 1, "image encoder needs at least one camera")
            need(
                self.image.backbone in IMAGE_BACKBONES,
                f"image backbone must be one of {IMAGE_BACKBONES}, got {self.image.backbone!r}",
            )
            need(
                self.image.height >= 16 and self.image.width >= 16,
                f"image size must be >= 16x16, got {self.image.height}x{self.image.width}",
            )
        if self.height_map is not None:
            hm = self.height_map
            need(
                len(hm.channels) == len(hm.strides) and len(hm.channels) >= 1,
                "height_map channels and strides must have the same non-zero length",
            )
            need(
                all(s >= 1 for s in hm.shape), f"height_map shape must be positive, got {hm.shape}"
            )
            need(
                hm.padding in CONV_PADDINGS,
                f"height_map padding must be one of {CONV_PADDINGS}, got {hm.padding!r}",
            )

    @property
    def num_cameras(self) -> int:
        return 0 if self.image is None else len(self.image.cameras)

    def replace(self, **changes) -> "WorldModelConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return {"format_version": CONFIG_FORMAT_VERSION, **to_plain(self)}

    @classmethod
    def from_dict(cls, data: dict) -> "WorldModelConfig":
        """Rebuild from `to_dict()` output; raises ValueError on a wrong version or key."""
        if not isinstance(data, dict):
            raise ValueError(f"world-model config must be a JSON object, got {type(data).__name__}")
        data = copy.deepcopy(data)  # legacy defaults are filled in below, the caller's stays
        version = data.pop("format_version", None)
        if version != CONFIG_FORMAT_VERSION:
            raise ValueError(
                f"world-model config format_version is {version!r}, this code reads "
                f"{CONFIG_FORMAT_VERSION}"
            )
        for key, off in REMOVED_OPTIONS.items():
            value = data.pop(key, off)
            if value != off:
                raise ValueError(
                    f"world-model config sets {key}={value!r}, an option this version removed "
                    f"({REMOVED_WHY[key]}); only {off!r} loads. Use the version that wrote it."
                )
        for key, legacy in LEGACY_DEFAULTS.items():
            *parents, leaf = key.split(".")
            node: typing.Any = data
            for name in parents:
                node = node.get(name) if isinstance(node, dict) else None
            if isinstance(node, dict):
                node.setdefault(leaf, copy.deepcopy(legacy))
        return from_plain(cls, data, "config")


# Keys added after format version 1 ("a.b" = key b of the object at a) and the behaviour a
# config written without them had.
LEGACY_DEFAULTS = {
    "normalize_latent": False,
    "state_dim": 0,
    "loss.state": 0.0,
    "policy_proprio_skip": False,
    "numerics": {"gelu_approximate": "none", "layer_norm_eps": 1e-5, "scaler_eps": 0.0},
    "reward_reads_latent_token": False,
    "height_map.padding": "symmetric",
    "height_map.flip": False,
}

# Options of earlier versions that are gone, with the value that meant "as without them": a
# checkpoint may hold them only with that value (it then builds the same network as today).
REMOVED_OPTIONS = {"policy_sees_history": True, "policy_proprio_gain": False}
REMOVED_WHY = {
    # pi reading z_t alone (f, R and V kept the history): on the peg its mean return fell from
    # 87.5 to 51.8, no insertions either way
    "policy_sees_history": "pi reading z_t without the history; measured worse on the peg",
    # a per-step proprio gain from pi's decoder token: its weights stayed near zero and pi's
    # insertions did not change (1 / 50 against 0 / 50)
    "policy_proprio_gain": "pi's per-step proprio gain; no measured benefit",
}


def to_plain(obj):
    if dataclasses.is_dataclass(obj):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, tuple):
        return [to_plain(v) for v in obj]
    return obj


def from_plain(cls, data: dict, where: str):
    """Build dataclass `cls` from a JSON dict, checking keys and value types on the way."""
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected an object for {cls.__name__}, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"{where}: unknown keys {unknown} for {cls.__name__}")
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            raise ValueError(f"{where}: missing key {f.name!r} for {cls.__name__}")
        kwargs[f.name] = _convert(hints[f.name], data[f.name], f"{where}.{f.name}")
    return cls(**kwargs)


def _convert(hint, value, where: str):
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _convert(inner, value, where)
    if dataclasses.is_dataclass(hint):
        return from_plain(hint, value, where)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{where}: expected a list, got {value!r}")
        return tuple(_convert(args[0], v, where) for v in value)
    if hint is dict or origin is dict:
        if not isinstance(value, dict):
            raise ValueError(f"{where}: expected an object, got {value!r}")
        return dict(value)
    if hint is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{where}: expected true or false, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{where}: expected an integer, got {value!r}")
        return value
    if hint is str:
        if not isinstance(value, str):
            raise ValueError(f"{where}: expected a string, got {value!r}")
        return value
    raise TypeError(f"{where}: unsupported config type {hint}")


# ---------------------------------------------------------------------------------------------
# Official configurations


def go2_config(**overrides) -> WorldModelConfig:
    """Official Go2 model: latent 64, H = T = 25, height-map CNN, command-conditioned R/V/pi."""
    base = WorldModelConfig(
        robot="go2",
        proprio_dim=35,  # lin vel 3, ang vel 3, gravity 3, joint pos 12, joint vel 12, phase 2
        action_dim=12,
        command_dim=3,
        history=25,
        horizon=25,
        height_map=HeightMapEncoderConfig(),
        dynamics=AttentionConfig(2, 8),
        reward=AttentionConfig(1, 4),
        value=AttentionConfig(1, 4),
        policy=AttentionConfig(4, 8),
    )
    return base.replace(**overrides)


UR5E_CAMERAS = ("wrist", "overhead", "side")


def ur5e_config(**overrides) -> WorldModelConfig:
    """Official UR5e model: three 224x224 cameras through ResNet-18, H = T = 5, 7-D actions."""
    base = WorldModelConfig(
        robot="ur5e",
        proprio_dim=6,
        action_dim=7,
        command_dim=0,
        history=5,
        horizon=5,
        image=ImageEncoderConfig(cameras=UR5E_CAMERAS, height=224, width=224),
        dynamics=AttentionConfig(3, 4),
        reward=AttentionConfig(1, 1),
        value=AttentionConfig(1, 1),
        policy=AttentionConfig(4, 8),
    )
    return base.replace(**overrides)


def ur5e_small_config(**overrides) -> WorldModelConfig:
    """CPU-sized UR5e model: the official transformer sizes, a small CNN at 64x64 per camera,
    and the auxiliary task-state loss in place of ImageNet features (LossWeights.state).

    H = 14, not 5: the data's expert holds still and closed for 11 steps before it lifts
    (InsertionExpert.CLOSE_STEPS), and only a history longer than that shows when to lift.
    pi reads the proprio directly too (`policy_proprio_skip`): a UR5e action is a delta on the
    measured TCP, which z holds to a centimetre and the proprio to 0.2 mm
    (docs/notebook/peg_wide.md).
    """
    base = ur5e_config(
        image=ImageEncoderConfig(cameras=UR5E_CAMERAS, height=64, width=64, backbone="small_cnn"),
        loss=LossWeights(state=4.0),
        history=14,
        policy_proprio_skip=True,
    )
    return base.replace(**overrides)


CONFIG_FACTORIES = {"go2": go2_config, "ur5e": ur5e_config, "ur5e_small": ur5e_small_config}
