"""Import the SimDist authors' pretrained Go2 world model (the official flax release) exactly.

The official export (scripts/export_official_orbax.py, docs/official_model.md) holds every array
of the official model state in `weights.npz`, keyed by its official path joined with `/`, and the
official `model_config.yaml`. `load_official` turns them into a `WorldModelConfig`, a state dict
and a scaler; `import_official` writes them as a normal project checkpoint. Nothing is trained.

Every array of the export is used exactly once (the dropout RNG counters `*/rngs/*/count` are
skipped by name) and every parameter of the model is set exactly once; a missing, extra,
mis-shaped, non-float or non-finite array is refused with its name, before anything is written.

The configuration reproduces the official forward pass: no LayerNorm on z
(`normalize_latent=False`), `OFFICIAL_NUMERICS` (tanh GELU, LayerNorm eps 1e-6, scaler eps 1e-8),
flax 'SAME' padding and the official height-map orientation (`height_map.padding / .flip`), and R
reading the context's z_t token. Layout conversions (official -> torch):

    Linear kernel (in, out)                     -> weight (out, in)
    MultiHeadAttention q/k/v kernel (D, h, d)   -> weight (h*d, D), bias (h, d) -> (h*d,)
    MultiHeadAttention out kernel (h, d, D)     -> weight (D, h*d)
    Conv kernel HWIO                            -> OIHW (both cross-correlate: no spatial flip)
    height-map spatial encodings (h, C), (w, C) -> row_embed (C, h, 1), col_embed (C, 1, w)
    first height-map projection                 -> input rows from flax's (h, w, C) flatten order
                                                   to torch's (C, h, w)
    LayerNorm scale                             -> weight
    scaler extero_obs (315,)                    -> height_map (21, 15) in `scan_to_grid` layout

`reference_errors` compares a model with the official outputs on fixed inputs (the layout of
the export's reference_io.npz, any batch size).
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import re
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
import yaml

from robot_drivers.go2.observation import scan_to_grid
from simdist_planner.model.checkpoint import save_checkpoint
from simdist_planner.model.config import (
    OFFICIAL_NUMERICS,
    AttentionConfig,
    HeightMapEncoderConfig,
    LossWeights,
    WorldModelConfig,
)
from simdist_planner.model.world_model import WorldModel

RELEASE = "github.com/CLeARoboticsLab/simdist"
# Official runs whose commit and step are known: run_name -> (commit, orbax step). A run not
# listed here records the commit and step given to `import_official` (or "unknown").
KNOWN_RUNS = {"go2_2026-02-12": ("8985ca1", 367004)}
RNG_COUNT = re.compile(r"(^|/)rngs/[^/]+/count$")
METRICS_KEY = "official_import"
PROVENANCE = "provenance.json"  # beside the export's weights: {"commit", "step", ...}
TOLERANCE = 1e-4  # reference check: max abs error (x the output's scaler std when unscaled)

REFERENCE_INPUTS = {  # name: (trailing dims as a function of the config) for the reference check
    "in/proprio_obs_hist": lambda c: (c.history + 1, c.proprio_dim),
    "in/extero_obs": lambda c: (c.height_map.shape[0] * c.height_map.shape[1],),
    "in/acts_hist": lambda c: (c.history, c.action_dim),
    "in/fut_acts": lambda c: (c.horizon, c.action_dim),
    "in/fut_cmds": lambda c: (c.horizon + 1, c.command_dim),
}
REFERENCE_OUTPUTS = (
    "encoding/history",
    "encoding/latent",
    "scaled_out/latents",
    "scaled_out/rewards",
    "scaled_out/values",
    "scaled_out/actions",
    "inference/latents",
    "inference/rewards",
    "inference/values",
    "inference/actions",
)
# unscaled outputs: their tolerance is TOLERANCE x this scaler quantity's std (latents have none)
UNSCALED_STD = {
    "inference/rewards": "rewards",
    "inference/values": "values",
    "inference/actions": "actions",
}


class OfficialImportError(ValueError):
    """The official export does not fit the project's model (names the array or setting)."""


# ------------------------------------------------------------------------------------- config
def official_config(cfg: Mapping) -> WorldModelConfig:
    """The WorldModelConfig of an official model_config.yaml; refuses what it cannot express."""

    def need(ok: bool, msg: str) -> None:
        if not ok:
            raise OfficialImportError(f"official config: {msg}")

    try:
        m, system = cfg["model"], cfg["system"]
        need(
            m.get("type") == "quadruped_world_model",
            f"model.type {m.get('type')!r}, only quadruped_world_model is supported",
        )
        ext = system["extero_obs"]["types"]
        need(
            len(ext) == 1 and isinstance(ext[0]["dim"], list) and len(ext[0]["dim"]) == 2,
            f"extero_obs must be one 2-D height scan, got {ext}",
        )
        emb = m["embedding"]
        for key in ("future_acts_layers", "future_cmds_layers", "reward_layers", "value_layers"):
            need(
                emb[key] == 0, f"embedding.{key} = {emb[key]}: the project's embedding is a Linear"
            )
        for head in ("reward", "value", "policy"):
            layers = m[head]["decoder"]["layers"]
            need(layers == 0, f"{head}.decoder.layers = {layers}: the project's output is a Linear")
        for head, mask in (("dynamics", "causal"), ("policy", "causal")) + tuple(
            (h, None) for h in ("reward", "value")
        ):
            got = m[head]["attention"]["mask"]
            need(got == mask, f"{head}.attention.mask = {got!r}, the project's model has {mask!r}")
        cnn = m["encoder"]["extero_obs"]["height_cnn"]
        feats, strides = list(cnn["features"]), list(cnn["strides"])
        need(
            len(feats) >= 1 and len(strides) >= len(feats) - 1,
            f"height_cnn features {feats} / strides {strides}",
        )
        # the official CNN zips features[:-1] with strides, then an output conv with strides[-1]
        conv_strides = tuple(strides[: len(feats) - 1]) + (strides[-1],)

        def attention(name: str) -> AttentionConfig:
            a = m[name]["attention"]
            return AttentionConfig(a["layers"], a["heads"], a["mlp_hidden_size_factor"])

        weights = cfg.get("loss", {}).get("weights", {})
        return WorldModelConfig(
            robot=system["name"],
            proprio_dim=sum(t["dim"] for t in system["proprio_obs"]["types"]),
            action_dim=len(system["actions"]),
            command_dim=system["cmd"]["dim"],
            history=m["dataset"]["history_length"],
            horizon=m["dataset"]["prediction_length"],
            latent_dim=m["latent_dim"],
            encoder_hidden_factor=m["encoder"]["mlp_hidden_size_factor"],
            proprio_layers=m["encoder"]["proprio_obs_layers"],
            action_layers=m["encoder"]["action_layers"],
            latent_layers=m["encoder"]["latent_layers"],
            normalize_latent=False,
            height_map=HeightMapEncoderConfig(
                shape=tuple(ext[0]["dim"]),
                channels=tuple(feats),
                strides=conv_strides,
                kernel_size=cnn["kernel_size"],
                projection_hidden=tuple(cnn["projection_hidden_dims"]),
                padding="same",
                flip=True,
            ),
            dynamics=attention("dynamics"),
            reward=attention("reward"),
            value=attention("value"),
            policy=attention("policy"),
            dynamics_kind="chunked",
            head_kind="transformer",
            # official modules.MLP puts dropout only between hidden layers, and every MLP given
            # the mlp rate (the transformer feed-forwards) has one hidden layer: it never applies
            dropout_mlp=0.0,
            dropout_attention=float(m["dropout"]["attention"]),
            numerics=OFFICIAL_NUMERICS,
            reward_reads_latent_token=True,
            loss=LossWeights(
                latent=float(weights.get("latent_dynamics", 1.0)),
                reward=float(weights.get("reward", 1.0)),
                value=float(weights.get("value", 1.0)),
                action=float(weights.get("action", 4.0)),
            ),
        )
    except (KeyError, TypeError) as err:
        raise OfficialImportError(f"official config: missing or malformed entry {err}") from err


# ------------------------------------------------------------------------------------ mapping
def _height_map(c: WorldModelConfig) -> HeightMapEncoderConfig:
    """The height-map encoder settings of `c`; the official model always reads a height map."""
    if c.height_map is None:
        raise OfficialImportError(f"{c.robot} world model has no height map; the official has one")
    return c.height_map


class _Mapper:
    """Takes each official array once (checked) and puts each model tensor once."""

    def __init__(self, arrays: Mapping[str, np.ndarray]):
        self.arrays = arrays
        self.used: set[str] = set()  # official array names taken
        self.state: dict[str, torch.Tensor] = {}  # model tensor name -> value

    def take(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
        if name not in self.arrays:
            raise OfficialImportError(f"official array {name!r} is missing (expected {shape})")
        if name in self.used:
            raise OfficialImportError(f"official array {name!r} is mapped twice")
        a = np.asarray(self.arrays[name])
        if tuple(a.shape) != tuple(shape):
            raise OfficialImportError(
                f"official array {name!r} has shape {tuple(a.shape)}, expected {tuple(shape)}"
            )
        if not np.issubdtype(a.dtype, np.floating):
            raise OfficialImportError(f"official array {name!r} has dtype {a.dtype}, not a float")
        if not np.isfinite(a).all():
            raise OfficialImportError(f"official array {name!r} contains NaN or Inf")
        self.used.add(name)
        return a.astype(np.float32)

    def put(self, key: str, value: np.ndarray, source: str) -> None:
        if key in self.state:
            raise OfficialImportError(f"model tensor {key!r} set twice (again from {source!r})")
        self.state[key] = torch.from_numpy(np.ascontiguousarray(value, dtype=np.float32))

    def linear(self, src: str, dst: str, n_in: int, n_out: int) -> None:
        self.put(f"{dst}.weight", self.take(f"{src}/kernel", (n_in, n_out)).T, src)
        self.put(f"{dst}.bias", self.take(f"{src}/bias", (n_out,)), src)

    def mlp(self, src: str, dst: str, n_in: int, hidden, n_out: int, dropout: bool) -> None:
        """official MLP (layers/i, output_layer) -> project MLP (net.j: Linear, GELU[, Dropout])."""
        step, prev = (3 if dropout else 2), n_in
        for i, width in enumerate(hidden):
            self.linear(f"{src}/layers/{i}", f"{dst}.net.{step * i}", prev, width)
            prev = width
        self.linear(f"{src}/output_layer", f"{dst}.net.{step * len(hidden)}", prev, n_out)

    def layer_norm(self, src: str, dst: str, d: int) -> None:
        self.put(f"{dst}.weight", self.take(f"{src}/scale", (d,)), src)
        self.put(f"{dst}.bias", self.take(f"{src}/bias", (d,)), src)

    def attention(self, src: str, dst: str, d: int, heads: int) -> None:
        hd = d // heads
        for theirs, ours in (("query", "q"), ("key", "k"), ("value", "v")):
            kernel = self.take(f"{src}/{theirs}/kernel", (d, heads, hd))
            self.put(f"{dst}.{ours}.weight", kernel.reshape(d, heads * hd).T, src)
            bias = self.take(f"{src}/{theirs}/bias", (heads, hd))
            self.put(f"{dst}.{ours}.bias", bias.reshape(-1), src)
        kernel = self.take(f"{src}/out/kernel", (heads, hd, d))
        self.put(f"{dst}.out.weight", kernel.reshape(heads * hd, d).T, src)
        self.put(f"{dst}.out.bias", self.take(f"{src}/out/bias", (d,)), src)

    def decoder(self, src: str, dst: str, d: int, att: AttentionConfig, dropout: bool) -> None:
        for i in range(att.layers):
            s, t = f"{src}/layers/{i}", f"{dst}.layers.{i}"
            self.attention(f"{s}/attention_1", f"{t}.self_attn", d, att.heads)
            self.attention(f"{s}/attention_2", f"{t}.cross_attn", d, att.heads)
            self.mlp(f"{s}/dense_proj", f"{t}.mlp", d, [d * att.mlp_factor], d, dropout)
            for j in (1, 2, 3):
                self.layer_norm(f"{s}/layernorm_{j}", f"{t}.norm{j}", d)

    def encoder(self, src: str, dst: str, d: int, att: AttentionConfig, dropout: bool) -> None:
        for i in range(att.layers):
            s, t = f"{src}/layers/{i}", f"{dst}.layers.{i}"
            self.attention(f"{s}/attention", f"{t}.attn", d, att.heads)
            self.mlp(f"{s}/dense_proj", f"{t}.mlp", d, [d * att.mlp_factor], d, dropout)
            for j in (1, 2):
                self.layer_norm(f"{s}/layernorm_{j}", f"{t}.norm{j}", d)

    def embedding(self, src: str, dst: str, n_in: int, d: int, seq: int) -> None:
        self.linear(f"{src}/enc/output_layer", f"{dst}.proj", n_in, d)
        self.put(f"{dst}.pos", self.take(f"{src}/pos_emb", (seq, d)), src)


def _map_height_map(mp: _Mapper, c: WorldModelConfig) -> None:
    hm, d = _height_map(c), c.latent_dim
    h, w = hm.shape
    prev, k = 1, hm.kernel_size
    names = [f"layers/{i}" for i in range(len(hm.channels) - 1)] + ["output_layer"]
    for i, (ch, stride, name) in enumerate(zip(hm.channels, hm.strides, names)):
        src = f"encoder/hm_enc/hm_cnn/cnn/{name}"
        kernel = mp.take(f"{src}/kernel", (k, k, prev, ch)).transpose(3, 2, 0, 1)
        mp.put(f"encoder.height_map.cnn.{2 * i}.weight", kernel, src)
        mp.put(f"encoder.height_map.cnn.{2 * i}.bias", mp.take(f"{src}/bias", (ch,)), src)
        prev, h, w = ch, -(-h // stride), -(-w // stride)
    src = "encoder/hm_enc/h_l_conv_enc"
    mp.put("encoder.height_map.row_embed", mp.take(src, (h, prev)).T[:, :, None], src)
    src = "encoder/hm_enc/h_w_conv_enc"
    mp.put("encoder.height_map.col_embed", mp.take(src, (w, prev)).T[:, None, :], src)
    flat, proj = h * w * prev, list(hm.projection_hidden)
    widths = proj + [d]
    # the first projection reads the conv features flattened (h, w, C) in flax, (C, h, w) here
    src = "encoder/hm_enc/hm_proj/" + ("layers/0" if proj else "output_layer")
    kernel = mp.take(f"{src}/kernel", (flat, widths[0])).reshape(h, w, prev, widths[0])
    kernel = kernel.transpose(2, 0, 1, 3).reshape(flat, widths[0])
    mp.put("encoder.height_map.proj.net.0.weight", kernel.T, src)
    mp.put("encoder.height_map.proj.net.0.bias", mp.take(f"{src}/bias", (widths[0],)), src)
    for i in range(1, len(widths)):
        src = "encoder/hm_enc/hm_proj/" + (f"layers/{i}" if i < len(proj) else "output_layer")
        mp.linear(src, f"encoder.height_map.proj.net.{2 * i}", widths[i - 1], widths[i])


def _map_weights(mp: _Mapper, c: WorldModelConfig) -> None:
    d, a, cmd, T = c.latent_dim, c.action_dim, c.command_dim, c.horizon
    hidden = d * c.encoder_hidden_factor
    drop = c.dropout_mlp > 0
    proprio_hidden = [hidden] * c.proprio_layers
    mp.mlp("encoder/proprio_obs_proj", "encoder.proprio", c.proprio_dim, proprio_hidden, d, drop)
    mp.mlp("encoder/act_proj", "history_encoder.action", a, [hidden] * c.action_layers, d, drop)
    mp.mlp("encoder/latent_mlp", "encoder.latent", 2 * d, [hidden] * c.latent_layers, d, drop)
    src = "encoder/temporal_enc"
    mp.put("history_encoder.temporal", mp.take(src, (c.history + 1, d)), src)
    mp.put("history_encoder.types", mp.take("encoder/type_enc", (3, d)), "encoder/type_enc")
    _map_height_map(mp, c)
    mp.embedding("fut_acts_embed", "f.action_embed", a, d, T)
    mp.decoder("dynamics", "f.decoder", d, c.dynamics, drop)
    mp.embedding("reward_emb", "reward_head.embed", d + a + cmd, d, T)
    mp.encoder("reward", "reward_head.encoder", d, c.reward, drop)
    mp.linear("reward_dec/output_layer", "reward_head.out", d, 1)
    mp.embedding("value_emb", "value_head.embed", d + cmd, d, T)
    mp.encoder("value", "value_head.encoder", d, c.value, drop)
    mp.linear("value_dec/output_layer", "value_head.out", d, 1)
    mp.embedding("fut_cmds_embed", "policy_head.query", cmd, d, T)
    mp.decoder("policy", "policy_head.decoder", d, c.policy, drop)
    mp.linear("policy_dec/output_layer", "policy_head.out", d, a)


def _map_scaler(mp: _Mapper, c: WorldModelConfig) -> dict:
    nx, ny = _height_map(c).shape
    spec = {  # project quantity: (official quantity, official shape, to the project's layout)
        "proprio": ("proprio_obs", (c.proprio_dim,), None),
        "actions": ("actions", (c.action_dim,), None),
        "command": ("commands", (c.command_dim,), None),
        "rewards": ("rewards", (1,), None),
        "values": ("values", (1,), None),
        "height_map": ("extero_obs", (nx * ny,), lambda x: scan_to_grid(x, nx, ny)),
    }
    stats = {}
    for ours, (theirs, shape, layout) in spec.items():
        mean, std = (
            mp.take(f"scaler/scaler_params/{theirs}/{what}", shape) for what in ("mean", "std")
        )
        if not (std > 0).all():
            raise OfficialImportError(
                f"official array 'scaler/scaler_params/{theirs}/std' has values <= 0"
            )
        if layout is not None:
            mean, std = layout(mean), layout(std)
        stats[ours] = {
            "shape": list(mean.shape),
            "mean": mean.astype(np.float64).ravel().tolist(),
            "std": std.astype(np.float64).ravel().tolist(),
        }
    return {"format_version": 1, "stats": stats}


@dataclass(frozen=True)
class OfficialModel:
    """What the export holds, in the project's terms."""

    config: WorldModelConfig
    state: dict[str, torch.Tensor]  # every model tensor but the scaler's
    scaler: dict  # Scaler.load_dict input

    def build(self) -> WorldModel:
        model = WorldModel(self.config)
        missing, unexpected = model.load_state_dict(self.state, strict=False)
        if unexpected or not all(k.startswith("scaler.") for k in missing):
            raise OfficialImportError(f"state does not fit: {missing=}, {unexpected=}")
        model.scaler.load_dict(self.scaler, source="official scaler")
        return model.eval()


def read_arrays(weights) -> dict[str, np.ndarray]:
    """The arrays of weights.npz (a path) or of a mapping, without the RNG counters."""
    if isinstance(weights, Mapping):
        return {k: np.asarray(v) for k, v in weights.items() if not RNG_COUNT.search(k)}
    with np.load(weights, allow_pickle=False) as z:
        return {k: z[k] for k in z.files if not RNG_COUNT.search(k)}


def read_official_config(path) -> dict:
    with open(path) as f:
        cfg = yaml.safe_load(f)
    if not isinstance(cfg, dict):
        raise OfficialImportError(f"{path}: not a YAML mapping")
    return cfg


def load_official(weights, config_yaml) -> OfficialModel:
    """The project's config, state dict and scaler of an official export.

    `weights`: the weights.npz path or a mapping of its arrays; `config_yaml`: the official
    model_config.yaml path or its parsed mapping. Raises OfficialImportError naming the array or
    setting that does not fit."""
    cfg = config_yaml if isinstance(config_yaml, Mapping) else read_official_config(config_yaml)
    config = official_config(cfg)
    arrays = read_arrays(weights)
    mp = _Mapper(arrays)
    _map_weights(mp, config)
    scaler = _map_scaler(mp, config)
    extra = sorted(set(arrays) - mp.used)
    if extra:
        raise OfficialImportError(f"official arrays the model has no place for: {extra}")
    want = {
        k: tuple(v.shape)
        for k, v in WorldModel(config).state_dict().items()
        if not k.startswith("scaler.")
    }
    unset, unknown = sorted(set(want) - set(mp.state)), sorted(set(mp.state) - set(want))
    if unset or unknown:
        raise OfficialImportError(f"model tensors not set: {unset}; not in the model: {unknown}")
    wrong = [
        f"{k} {tuple(v.shape)} != {want[k]}" for k, v in mp.state.items() if v.shape != want[k]
    ]
    if wrong:
        raise OfficialImportError(f"mapped shapes differ from the model's: {wrong}")
    return OfficialModel(config, mp.state, scaler)


def official_array_names(config: WorldModelConfig) -> set[str]:
    """The names of the arrays `load_official` takes for `config` (without the RNG counters)."""

    class _Recorder(_Mapper):  # records every name it is asked for, hands back ones
        def take(self, name, shape):
            self.used.add(name)
            return np.ones(shape, np.float32)

        def put(self, key, value, source):
            pass

    mp = _Recorder({})
    _map_weights(mp, config)
    _map_scaler(mp, config)
    return set(mp.used)


# --------------------------------------------------------------------------------- provenance
def _sha256(path) -> str:
    return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()


def provenance(
    weights, config_yaml, license_file, commit: str | None = None, step: int | None = None
) -> dict:
    """Where the imported weights come from, with the MIT notice they must carry.

    The commit and step are, in this order: the arguments, the export's provenance.json (written
    by scripts/export_official_orbax.py beside the weights), `KNOWN_RUNS`, "unknown"."""
    cfg = read_official_config(config_yaml)
    run = str(cfg.get("run_name", "unknown"))
    known_commit, known_step = KNOWN_RUNS.get(run, ("unknown", None))
    recorded_file = pathlib.Path(weights).parent / PROVENANCE
    if recorded_file.is_file():
        recorded = json.loads(recorded_file.read_text())
        known_commit = recorded.get("commit", known_commit)
        known_step = recorded.get("step", known_step)
    license_file = pathlib.Path(license_file)
    if not license_file.is_file():
        raise OfficialImportError(
            f"{license_file}: missing; the official weights are MIT-licensed and their notice "
            "travels with them (the release's LICENSE file)"
        )
    notice = license_file.read_text()
    if "MIT License" not in notice or "Permission is hereby granted" not in notice:
        raise OfficialImportError(f"{license_file}: not the MIT licence of the official release")
    return {
        "release": RELEASE,
        "commit": commit or known_commit,
        "run_name": run,
        "step": step if step is not None else known_step,
        "weights_sha256": _sha256(weights),
        "config_sha256": _sha256(config_yaml),
        "license": "MIT",
        "license_notice": notice,
    }


def import_official(
    weights,
    config_yaml,
    out,
    license_file=None,
    commit: str | None = None,
    step: int | None = None,
    extra_metrics: Mapping | None = None,
) -> pathlib.Path:
    """Write the official export as a project checkpoint at `out` (atomically, all checks first).

    `license_file` defaults to the LICENSE beside the weights; the checkpoint's metrics.json
    records the provenance and the notice under "official_import"."""
    weights = pathlib.Path(weights)
    license_file = weights.parent / "LICENSE" if license_file is None else license_file
    info = provenance(weights, config_yaml, license_file, commit, step)
    model = load_official(weights, config_yaml).build()
    metrics = {METRICS_KEY: {**info, **(extra_metrics or {})}}
    return save_checkpoint(model, out, metrics=metrics)


def is_official(config: WorldModelConfig) -> bool:
    """Whether a config is that of an imported official model (the importer's settings)."""
    return (
        config.numerics == OFFICIAL_NUMERICS
        and config.reward_reads_latent_token
        and config.height_map is not None
        and config.height_map.padding == "same"
        and config.height_map.flip
    )


# ---------------------------------------------------------------------------- reference check
def check_reference_layout(
    config: WorldModelConfig, ref: Mapping[str, np.ndarray], with_outputs: bool = True
) -> int:
    """The batch size of a reference file; raises ValueError naming a missing or wrong array.
    `with_outputs=False` checks the inputs (`in/*`) only."""
    batch: int | None = None
    for name, tail in REFERENCE_INPUTS.items():
        if name not in ref:
            raise ValueError(f"reference has no {name!r}")
        shape, want = tuple(np.shape(ref[name])), tail(config)
        if len(shape) != len(want) + 1 or shape[1:] != want or (batch not in (None, shape[0])):
            raise ValueError(f"reference {name!r} has shape {shape}, expected (B, *{want})")
        batch = shape[0]
    for name in REFERENCE_OUTPUTS if with_outputs else ():
        if name not in ref:
            raise ValueError(f"reference has no {name!r}")
        if np.shape(ref[name])[:1] != (batch,):
            raise ValueError(f"reference {name!r} has shape {np.shape(ref[name])}, batch {batch}")
    assert batch is not None  # REFERENCE_INPUTS names at least one array
    return batch


@torch.no_grad()
def reference_outputs(model: WorldModel, ref: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The model's outputs for the official inputs `in/*` (the layout of reference_io.npz, any
    batch size), under the reference's output names."""
    cfg = model.config
    check_reference_layout(cfg, ref, with_outputs=False)

    def t(name):
        return torch.from_numpy(np.asarray(ref[name], dtype=np.float32))

    proprio, actions_hist = t("in/proprio_obs_hist"), t("in/acts_hist")
    actions, commands = t("in/fut_acts"), t("in/fut_cmds")
    nx, ny = _height_map(cfg).shape
    scans = np.asarray(ref["in/extero_obs"], dtype=np.float32)
    height_map = torch.from_numpy(np.stack([scan_to_grid(s, nx, ny) for s in scans]))
    z = model.encode({"proprio": proprio[:, -1], "height_map": height_map})
    history = model.encode_history(proprio[:, :-1], actions_hist)
    predicted = model.dynamics(z, actions, history)
    latents = torch.cat((z.unsqueeze(1), predicted), dim=1)
    s = model.scaler
    actions_n, commands_n = s.normalize("actions", actions), s.normalize("command", commands)
    out = {
        "encoding/history": history,
        "encoding/latent": model.history_encoder.latent_token(z),
        "scaled_out/latents": predicted,
        "scaled_out/rewards": model.reward_n(latents, actions_n, commands_n),
        "scaled_out/values": model.value_n(latents, commands_n),
        "scaled_out/actions": model.policy_n(z, history, commands_n[:, : cfg.horizon], cfg.horizon),
        "inference/latents": predicted,
        "inference/rewards": model.reward(latents, actions, commands),
        "inference/values": model.value(latents, commands),
        "inference/actions": model.policy(z, history, commands),
    }
    return {k: v.numpy() for k, v in out.items()}


@dataclass(frozen=True)
class ReferenceError:
    """One output's max abs error against the reference and its tolerance (per dimension for
    unscaled outputs: TOLERANCE x the scaler std of each dimension)."""

    name: str
    max_abs: float
    tolerance: float  # the smallest per-dimension tolerance
    ratio: float  # the worst error / tolerance over the dimensions

    @property
    def ok(self) -> bool:
        return self.ratio <= 1.0

    def line(self) -> str:
        per = ""
        if self.name in UNSCALED_STD:
            per = " (x std per dim)" if self.name == "inference/actions" else " (x std)"
        verdict = "ok" if self.ok else "FAIL"
        return (
            f"{self.name:20s} max abs error {self.max_abs:.3e}  tolerance >= {self.tolerance:.3e}"
            f"{per}  ({self.ratio:.3f} of it)  {verdict}"
        )


def reference_errors(
    model: WorldModel, ref: Mapping[str, np.ndarray], tolerance: float = TOLERANCE
) -> list[ReferenceError]:
    """Per output: the max abs error of `model` against the reference outputs `ref`."""
    check_reference_layout(model.config, ref)
    out = reference_outputs(model, ref)
    result = []
    for name in REFERENCE_OUTPUTS:
        want = np.asarray(ref[name], dtype=np.float64)
        if out[name].shape != want.shape:
            raise ValueError(f"reference {name!r} has shape {want.shape}, model {out[name].shape}")
        err = np.abs(out[name].astype(np.float64) - want)
        if name in UNSCALED_STD:
            std = model.scaler.std(UNSCALED_STD[name]).double().numpy()
            bound = tolerance * (std[0] if std.shape == (1,) else std)
        else:
            bound = np.float64(tolerance)
        ratio = float((err / bound).max()) if err.size else 0.0
        result.append(ReferenceError(name, float(err.max()), float(np.min(bound)), ratio))
    return result
