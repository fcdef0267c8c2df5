"""Typed pretraining configuration (simdist-pretrain), saved as <run>/pretrain.json.

`PretrainConfig` holds the run's shape (model, steps, batch, seed, checkpoints, runtime) and one
frozen group per concern: `optimiser`, `augmentation`, `data`, and the optional `encoder_stage`
and `checkpoint_selection` (None = off). Defaults are the paper's where it has one. Each field
says what it is and its unit.

The command line and the presets speak the flat flag names (`--learning-rate`, `--image-shift`,
`--encoder-steps`, ...); `FLAT_FIELDS` maps each onto its group, `PretrainConfig.from_flat`
builds a config from them, and `PretrainConfig.from_dict` also reads a pretrain.json written in
that flat form by earlier versions.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from simdist_planner.data.schema import PRELOAD_MODES
from simdist_planner.model.config import (
    CONFIG_FACTORIES,
    SMALL_BACKBONES,
    WorldModelConfig,
    from_plain,
    to_plain,
)


def _check(ok: bool, where: str, msg: str) -> None:
    if not ok:
        raise ValueError(f"{where}: {msg}")


def _positive_number(value) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


def _check_near_field(near, where: str, name: str) -> None:
    _check(
        isinstance(near, dict) and all(_positive_number(v) for v in near.values()),
        where,
        f"{name} must map state terms to positive scales, got {near!r}",
    )


@dataclass(frozen=True)
class OptimiserConfig:
    """Adam; the learning rate rises linearly from 0 to `learning_rate` over `warmup_steps`, then
    follows a cosine down to `end_learning_rate` (the official optax schedule)."""

    learning_rate: float = 2e-4  # peak learning rate (official 2e-4)
    end_learning_rate: float = 1e-4  # where the cosine ends (official 1e-4)
    warmup_steps: int = 100  # optimiser steps of the linear warm-up
    # Optimiser steps from 0 to the end of the cosine; 0 = the run's `steps`. A continued run
    # (`init_from`) sets it to decay over its own length.
    decay_steps: int = 0

    def __post_init__(self) -> None:
        where = "PretrainConfig.optimiser"
        for name in ("warmup_steps", "decay_steps"):
            _check(
                getattr(self, name) >= 0, where, f"{name} must be >= 0, got {getattr(self, name)}"
            )
        _check(
            self.learning_rate > 0 and self.end_learning_rate >= 0,
            where,
            "learning rates must be positive",
        )


@dataclass(frozen=True)
class AugmentationConfig:
    """Observation augmentation on the model inputs o_{t-H..t} (targets stay clean): per-term
    Gaussian noise with the stds stored in the dataset, and for camera images a brightness /
    contrast change of o_t and a random shift of o_t and the target frames alike."""

    enabled: bool = True  # all of the augmentation (flag --augment)
    image_brightness: float = 0.2  # +- fraction; multiplicative, per window and camera
    image_contrast: float = 0.2  # +- fraction about the image mean, per window and camera
    image_shift: int = 4  # pixels of random translation (border pixels repeated), per axis
    # Cameras the shift never moves: mounted on the robot, their view of the hand is fixed, so
    # where an object sits in the image is where it sits relative to the hand (at 64 x 64 the
    # wrist camera's 4 px are 3 mm at the peg's bottom: label noise on exactly what an insertion
    # needs). Measured on the peg: the latent's readout of the peg relative to the hand went from
    # 17.1 to 14.1 mm over 3,500 more steps with the wrist camera fixed (docs/notebook).
    fixed_cameras: tuple[str, ...] = ("wrist",)

    def __post_init__(self) -> None:
        where = "PretrainConfig.augmentation"
        _check(self.image_shift >= 0, where, f"image_shift must be >= 0, got {self.image_shift}")
        for name in ("image_brightness", "image_contrast"):
            _check(
                0.0 <= getattr(self, name) < 1.0,
                where,
                f"{name} must be in [0, 1), got {getattr(self, name)}",
            )


@dataclass(frozen=True)
class DataConfig:
    """What the run trains on: the episodes of `paths` that ShardedDataset selects
    (docs/dataset.md), or synthetic windows."""

    paths: tuple[str, ...] = ()  # shard files or directories (flag --data)
    synthetic: bool = False  # train on synthetic_windows instead (smoke runs and tests)
    fraction: float = 1.0  # share of the episodes selected, in (0, 1] (Table I data ablations)
    expert_only: bool = False  # only episodes the expert drove unnoised (Table I)
    max_data_steps: int = 0  # cap on the selection's rows; 0 = no cap (Table I)
    selection_seed: int = 0  # seed of the selection's episode permutation
    # What the loader holds in memory: "vectors" reads image rows from the shards per window
    # (gzip chunks); "all" holds the selection's images too (37 KB per UR5e row at 3 x 64 x 64:
    # 2.3 GB for the ur5e_peg preset's 64 k rows) and makes a window a memory copy; "none" reads
    # everything lazily.
    preload: str = "vectors"
    # {phase: weight}: windows whose step t lies in a phase the dataset's task names
    # (robot_drivers.registry.step_phases) are drawn `weight` times as often as the rest, so a
    # rare decision is not averaged away (docs/world_model.md); {} = every window alike.
    phase_weights: dict = field(default_factory=dict)
    # Rows (whole episodes, in selection order) that fit the scaler: enough that a rare flag's
    # std is estimated well. Its normalised 1 is (1 - p) / std, so an std fitted on a sample
    # where the flag is rarer than in the data weighs it by that ratio squared (10,000 rows of
    # one peg data set put the `seated` flag's std at 0.0099 instead of 0.059: the state loss
    # was 3.3 at the start and 1.9 at the end against 0.9 and 0.12, and pi inserted 6 of 150).
    scaler_rows: int = 500_000

    def __post_init__(self) -> None:
        where = "PretrainConfig.data"
        _check(
            self.synthetic or len(self.paths) > 0,
            "PretrainConfig",
            "give data (shard files / directories) or synthetic=True",
        )
        _check(
            0.0 < self.fraction <= 1.0, where, f"fraction must be in (0, 1], got {self.fraction}"
        )
        _check(
            self.max_data_steps >= 0,
            where,
            f"max_data_steps must be >= 0, got {self.max_data_steps}",
        )
        _check(self.scaler_rows >= 1, where, f"scaler_rows must be >= 1, got {self.scaler_rows}")
        _check(
            self.preload in PRELOAD_MODES,
            where,
            f"preload must be one of {PRELOAD_MODES}, got {self.preload!r}",
        )
        _check(
            isinstance(self.phase_weights, dict)
            and all(isinstance(k, str) for k in self.phase_weights),
            where,
            f"phase_weights must map phase names to weights, got {self.phase_weights!r}",
        )
        _check(
            not (self.synthetic and self.phase_weights),
            where,
            "phase_weights need a dataset, not synthetic windows",
        )
        for phase, weight in self.phase_weights.items():
            _check(
                _positive_number(weight),
                where,
                f"phase_weights[{phase!r}] must be a positive number, got {weight!r}",
            )


@dataclass(frozen=True)
class EncoderStage:
    """A first stage (training.encoder_stage): the image backbone and a throw-away head learn to
    predict the task state from the cameras and the proprio, in place of the paper's ImageNet
    features; the stage is skipped when a run resumes. Measured on the peg: the backbone then
    reads the peg's place at the hole to about 2.4 mm (Eq. 2 alone: 4-8 mm; the hole's clearance
    is 1 mm), and a frozen backbone keeps that through Eq. 2 (docs/notebook)."""

    steps: int  # batches of the stage (flag --encoder-steps; the batch is the run's batch_size)
    learning_rate: float = 1e-3  # peak; linear warm-up over 5 % of the stage, cosine to a tenth
    # {state term: scale in the term's unit}: also predict tanh(term / scale), so that
    # millimetres near a target (e.g. {"bottom_to_hole": 0.005}) count as much as the term's
    # spread over all the data.
    near_field: dict = field(default_factory=dict)
    # Keep the backbone as the stage left it for the rest of the run (weights and batch-norm
    # statistics), the way a pretrained feature extractor is used.
    freeze_backbone: bool = False

    def __post_init__(self) -> None:
        where = "PretrainConfig.encoder_stage"
        _check(self.steps >= 1, where, f"steps must be >= 1 (None = no stage), got {self.steps}")
        _check(
            self.learning_rate > 0,
            where,
            f"learning_rate must be positive, got {self.learning_rate}",
        )
        _check_near_field(self.near_field, where, "encoder_near_field")


@dataclass(frozen=True)
class CheckpointSelection:
    """Which kept checkpoint becomes a run's model: the one whose base policy pi does best
    (success rate, then mean return) on seeded simulation episodes, scored after pretraining
    (evaluation.checkpoint_selection). Its seeds lie apart from the evaluation's (0...), so an
    evaluation afterwards stays a fair test. Measured on the peg: pi's success swings between
    checkpoints 250 steps apart while every loss agrees; of eight kept, the selected one turned
    two runs whose last step inserted 0 / 50 into 15 / 50 and 18 / 50 (docs/notebook)."""

    task: str  # a simulation task (robot_drivers.registry.TASKS), e.g. "peg"
    region: str = ""  # UR5e tasks: "narrow" / "wide"; "" = the task's default
    variant: str = "sim"  # "sim" or "real" variant of the task
    episodes: int = 20  # episodes per checkpoint
    seed: int = 1000  # episodes use seeds seed, seed + 1, ...
    max_steps: int = 0  # control steps per episode; 0 = the task's own episode length
    workers: int = 1  # processes, one checkpoint each at a time

    def __post_init__(self) -> None:
        if not self.task:
            raise ValueError(
                "CheckpointSelection: give the task whose episodes score the checkpoints"
            )
        if self.variant not in ("sim", "real"):
            raise ValueError(
                f"CheckpointSelection: variant must be 'sim' or 'real', got {self.variant!r}"
            )
        for name in ("episodes", "workers"):
            if getattr(self, name) < 1:
                raise ValueError(
                    f"CheckpointSelection: {name} must be >= 1, got {getattr(self, name)}"
                )
        for name in ("seed", "max_steps"):
            if getattr(self, name) < 0:
                raise ValueError(
                    f"CheckpointSelection: {name} must be >= 0, got {getattr(self, name)}"
                )


@dataclass(frozen=True)
class PretrainConfig:
    """One pretraining run; saved as <out>/pretrain.json, and a resumed run must match it."""

    data: DataConfig  # what the run trains on
    model: str = "ur5e_small"  # key of CONFIG_FACTORIES; dims are taken from the dataset
    model_overrides: dict = field(default_factory=dict)  # deep-merged into the model config
    steps: int = 2000  # optimiser steps of the run
    batch_size: int = 32  # windows per optimiser step and rank
    seed: int = 42  # seeds the initial weights and every per-step draw (with rank and step)
    optimiser: OptimiserConfig = OptimiserConfig()
    augmentation: AugmentationConfig = AugmentationConfig()
    # {state term: scale}: the state head's output for these terms (LossWeights.state) is also
    # scored as tanh(term / scale), so z must keep their millimetres too. Measured on the peg
    # (same stage, data and seed): pi inserted 21 / 100 with it against 5 / 100 without.
    state_near_field: dict = field(default_factory=dict)
    encoder_stage: EncoderStage | None = None  # None = the backbone learns through Eq. 2 only
    # None = the model is the last step's weights; else the kept checkpoint (keep_checkpoints of
    # them, checkpoint_every apart) that this closed-loop test scores best.
    checkpoint_selection: CheckpointSelection | None = None
    checkpoint_every: int = 250  # optimiser steps between checkpoints (and train-state saves)
    keep_checkpoints: int = 3  # the newest checkpoints kept in checkpoints/
    log_every: int = 10  # optimiser steps between TensorBoard scalars
    workers: int = 1  # DataLoader worker processes per rank
    threads: int = 1  # torch CPU threads per rank
    precision: str = "auto"  # "auto" (bf16 on CUDA), "bf16", "fp32"
    compile: bool = False  # torch.compile the training model (CUDA)
    time_limit_s: float = (
        0.0  # seconds of wall clock for this run (0 = none): stop, save, resume later
    )
    # A checkpoint directory to start from: its weights and scaler, a fresh optimiser and schedule
    # (continued pretraining); "" = random initial weights.
    init_from: str = ""

    def __post_init__(self) -> None:
        where = "PretrainConfig"
        _check(
            self.model in CONFIG_FACTORIES,
            where,
            f"model must be one of {sorted(CONFIG_FACTORIES)}, got {self.model!r}",
        )
        for name in ("steps", "batch_size", "checkpoint_every", "keep_checkpoints", "log_every"):
            _check(
                getattr(self, name) >= 1, where, f"{name} must be >= 1, got {getattr(self, name)}"
            )
        _check(self.threads >= 1, where, f"threads must be >= 1, got {self.threads}")
        for name in ("workers", "time_limit_s"):
            _check(
                getattr(self, name) >= 0, where, f"{name} must be >= 0, got {getattr(self, name)}"
            )
        _check_near_field(self.state_near_field, where, "state_near_field")
        _check(
            not (self.data.synthetic and self.state_near_field),
            where,
            "state_near_field needs a dataset, not synthetic windows",
        )
        _check(
            not (self.data.synthetic and self.encoder_stage is not None),
            where,
            "encoder_steps need a dataset, not synthetic windows",
        )
        _check(
            self.precision in ("auto", "bf16", "fp32"),
            where,
            f"precision must be auto, bf16 or fp32, got {self.precision!r}",
        )

    def replace(self, **changes) -> "PretrainConfig":
        """A copy with `changes`, given by field name or by flat flag name (FLAT_FIELDS), e.g.
        `cfg.replace(steps=10, image_shift=0, encoder_steps=20)`."""
        top = {k: v for k, v in changes.items() if k not in FLAT_FIELDS}
        unknown = set(top) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise TypeError(f"PretrainConfig.replace: unknown settings {sorted(unknown)}")
        flat = {k: v for k, v in changes.items() if k in FLAT_FIELDS}
        if flat:
            base = {**self.to_flat(), **flat}
            top = {**_nest(base), **top}
        return dataclasses.replace(self, **top)

    def to_dict(self) -> dict:
        return to_plain(self)

    def to_flat(self) -> dict:
        """The settings by flat flag name (the command line's and the presets' form)."""
        out = {}
        for name, (group, leaf) in FLAT_FIELDS.items():
            owner = self if group is None else getattr(self, group)
            if owner is None:  # the encoder stage is off
                out[name] = _STAGE_OFF[name]
            else:
                out[name] = getattr(owner, leaf)
        return out

    @classmethod
    def from_flat(cls, values: dict) -> "PretrainConfig":
        """Build from flat flag names (FLAT_FIELDS: `learning_rate`, `data`, `encoder_steps`, ...);
        settings not given keep their defaults."""
        unknown = sorted(set(values) - set(FLAT_FIELDS))
        if unknown:
            raise TypeError(f"PretrainConfig: unknown settings {unknown}")
        return cls(**_nest(values))

    @classmethod
    def from_dict(cls, data: dict) -> "PretrainConfig":
        """Rebuild from `to_dict()` output, or from the flat pretrain.json of earlier versions."""
        if isinstance(data, dict) and _is_flat(data):
            data = flat_to_nested(data)
        return from_plain(cls, data, "pretrain config")


# Flat (flag) name -> (group, field) of PretrainConfig; group None = a top-level field.
FLAT_FIELDS: dict[str, tuple[str | None, str]] = {
    "model": (None, "model"),
    "model_overrides": (None, "model_overrides"),
    "data": ("data", "paths"),
    "synthetic": ("data", "synthetic"),
    "fraction": ("data", "fraction"),
    "expert_only": ("data", "expert_only"),
    "max_data_steps": ("data", "max_data_steps"),
    "selection_seed": ("data", "selection_seed"),
    "preload": ("data", "preload"),
    "phase_weights": ("data", "phase_weights"),
    "scaler_rows": ("data", "scaler_rows"),
    "steps": (None, "steps"),
    "batch_size": (None, "batch_size"),
    "learning_rate": ("optimiser", "learning_rate"),
    "end_learning_rate": ("optimiser", "end_learning_rate"),
    "warmup_steps": ("optimiser", "warmup_steps"),
    "decay_steps": ("optimiser", "decay_steps"),
    "augment": ("augmentation", "enabled"),
    "image_brightness": ("augmentation", "image_brightness"),
    "image_contrast": ("augmentation", "image_contrast"),
    "image_shift": ("augmentation", "image_shift"),
    "fixed_cameras": ("augmentation", "fixed_cameras"),
    "seed": (None, "seed"),
    "checkpoint_every": (None, "checkpoint_every"),
    "keep_checkpoints": (None, "keep_checkpoints"),
    "log_every": (None, "log_every"),
    "workers": (None, "workers"),
    "threads": (None, "threads"),
    "precision": (None, "precision"),
    "compile": (None, "compile"),
    "time_limit_s": (None, "time_limit_s"),
    "init_from": (None, "init_from"),
    "encoder_steps": ("encoder_stage", "steps"),
    "encoder_learning_rate": ("encoder_stage", "learning_rate"),
    "encoder_near_field": ("encoder_stage", "near_field"),
    "freeze_image_backbone": ("encoder_stage", "freeze_backbone"),
    "state_near_field": (None, "state_near_field"),
    "checkpoint_selection": (None, "checkpoint_selection"),
}

# The flat encoder settings of a run without the stage.
_STAGE_OFF: dict[str, object] = {
    "encoder_steps": 0,
    "encoder_learning_rate": EncoderStage.__dataclass_fields__["learning_rate"].default,
    "encoder_near_field": {},
    "freeze_image_backbone": False,
}

# Settings of earlier versions that are gone, with the value that meant "off": an old
# pretrain.json may hold them only with that value.
REMOVED_SETTINGS = {
    # an exponential moving average of the weights: on the peg preset it changed nothing
    # measured (pi's success from the average equalled the last step's on three runs)
    "ema_decay": 0.0,
    # gradient-norm clipping: off in every preset and never measured (official: none)
    "grad_clip": 0.0,
}


def _nest(values: dict) -> dict:
    """Flat flag names -> PretrainConfig keyword arguments (groups built, defaults filled in)."""
    top: dict = {}
    groups: dict[str, dict] = {"data": {}, "optimiser": {}, "augmentation": {}, "encoder_stage": {}}
    for name, value in values.items():
        group, leaf = FLAT_FIELDS[name]
        if group is None:
            top[name] = value
        else:
            tuple_field = leaf in ("paths", "fixed_cameras") and isinstance(value, list)
            groups[group][leaf] = tuple(value) if tuple_field else value
    stage = groups.pop("encoder_stage")
    if stage.get("steps", 0):
        top["encoder_stage"] = EncoderStage(**stage)
    elif stage.get("freeze_backbone", False):
        raise ValueError(
            "PretrainConfig: freeze_image_backbone keeps a trained backbone: give encoder_steps "
            "(the stage that trains it; a backbone loaded by init_from is not frozen)"
        )
    else:  # no stage: its other settings have nothing to act on
        top["encoder_stage"] = None
    top["data"] = DataConfig(**groups.pop("data"))
    top["optimiser"] = OptimiserConfig(**groups.pop("optimiser"))
    top["augmentation"] = AugmentationConfig(**groups.pop("augmentation"))
    return top


def _is_flat(data: dict) -> bool:
    """A pretrain.json of the flat form (earlier versions): `data` is a list of paths."""
    return isinstance(data.get("data"), (list, tuple)) or "learning_rate" in data


def flat_to_nested(data: dict) -> dict:
    """A flat pretrain.json of earlier versions -> the nested `to_dict()` form. Removed settings
    are accepted with their "off" value only; a run that used one cannot continue here."""
    data = dict(data)
    for name, off in REMOVED_SETTINGS.items():
        value = data.pop(name, off)
        if value != off:
            raise ValueError(
                f"pretrain config: {name}={value!r} is a removed setting (only {off!r} is "
                f"accepted); this version cannot continue that run. Its checkpoints and model/ "
                "still load"
            )
    unknown = sorted(set(data) - set(FLAT_FIELDS))
    if unknown:
        raise ValueError(f"pretrain config: unknown keys {unknown} for PretrainConfig")
    selection = data.get("checkpoint_selection")
    if isinstance(selection, dict):
        data["checkpoint_selection"] = from_plain(
            CheckpointSelection, selection, "pretrain config.checkpoint_selection"
        )
    try:
        cfg = PretrainConfig(**_nest(data))
    except TypeError as err:
        raise ValueError(f"pretrain config: {err}") from err
    return cfg.to_dict()


# The peg's terms whose millimetres matter (the hole's clearance is 1 mm per side), and scales.
PEG_NEAR_FIELD = {"bottom_to_hole": 0.005, "tcp_to_grasp": 0.005}
# Small defaults that train on this 2-core CPU in under an hour (see docs/world_model.md), in flat
# flag names (PretrainConfig.from_flat): a flag given to simdist-pretrain overrides the preset's.
PRETRAIN_PRESETS = {
    # 9000 x 32 on 400 peg + 600 start-phase episodes (64-67 k rows): 30-51 min on both cores.
    # Half as many steps (24 min) left a base policy that rarely grasped (docs/world_model.md).
    # The encoder stage stands in for the paper's ImageNet features (the backbone then frozen),
    # the last centimetre is drawn four times as often, and the near-field terms are scored on z
    # too. The model is the best of the last eight checkpoints by pi's success on 20 Peg Wide
    # episodes (seeds 1000-1019). Each of these is measured in docs/notebook/peg_wide.md.
    "ur5e_peg": dict(
        model="ur5e_small",
        steps=9000,
        batch_size=32,
        warmup_steps=60,
        threads=2,
        preload="all",
        phase_weights={"at_hole": 4},
        encoder_steps=12000,
        freeze_image_backbone=True,
        encoder_near_field=PEG_NEAR_FIELD,
        state_near_field=PEG_NEAR_FIELD,
        keep_checkpoints=8,
        checkpoint_selection=CheckpointSelection(task="peg", region="wide", workers=2),
    ),
    # 2000 optimiser steps of 128 windows: on fixed-friction data its base policy crossed the sim
    # slope 10 / 10 (2100 x 256: 1 / 5); on friction-randomised data 0 / 10 (docs/world_model.md)
    "go2": dict(model="go2", steps=2000, batch_size=128, warmup_steps=100, threads=2),
}


def _deep_merge(base: dict, changes: dict) -> dict:
    out = dict(base)
    for k, v in changes.items():
        out[k] = (
            _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
        )
    return out


def model_config_for(cfg: PretrainConfig, layout=None) -> WorldModelConfig:
    """The preset's architecture with the dataset's dimensions and the run's overrides."""
    base = CONFIG_FACTORIES[cfg.model]()
    if layout is not None:
        changes = dict(
            proprio_dim=layout.proprio_dim,
            action_dim=layout.action_dim,
            command_dim=layout.command_dim,
        )
        if base.height_map is not None or layout.height_map_shape:
            if not layout.height_map_shape or base.height_map is None:
                raise ValueError(
                    f"model {cfg.model!r} and the dataset disagree on the height map "
                    f"(dataset: {layout.height_map_shape})"
                )
            changes["height_map"] = base.height_map.__class__(
                **{**base.height_map.__dict__, "shape": tuple(layout.height_map_shape)}
            )
        if base.image is not None or layout.cameras:
            if not layout.cameras or base.image is None:
                raise ValueError(
                    f"model {cfg.model!r} and the dataset disagree on cameras "
                    f"(dataset: {layout.cameras})"
                )
            image = {**base.image.__dict__, "cameras": tuple(layout.cameras)}
            if base.image.backbone in SMALL_BACKBONES:  # encode at the rendered resolution
                image["height"], image["width"] = (int(s) for s in layout.image_shape)
            changes["image"] = base.image.__class__(**image)
        base = base.replace(**changes)
    if cfg.model_overrides:
        try:
            base = WorldModelConfig.from_dict(_deep_merge(base.to_dict(), cfg.model_overrides))
        except (ValueError, TypeError) as err:
            raise ValueError(f"model_overrides {cfg.model_overrides}: {err}") from err
    if base.loss.state > 0:  # the state head is sized by the task state the shards hold
        state_dim = (
            base.proprio_dim if layout is None else layout.state_dim
        )  # synthetic: a view of x
        if state_dim == 0:
            raise ValueError(
                f"model {cfg.model!r} trains the auxiliary state loss (loss.state "
                f"{base.loss.state}) but the dataset holds no task state: generate it with this "
                'version, or pass --model-overrides \'{"loss": {"state": 0}}\''
            )
        base = base.replace(state_dim=state_dim)
    return base
