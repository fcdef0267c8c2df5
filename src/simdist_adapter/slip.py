"""`simdist-slip`: what f predicts for slipping feet, before and after adaptation (Go2).

On the held-out windows of D_real (the split the gate uses), each model's f predicts the T
latents that follow the real actions. A ridge probe, fitted on the frozen encoder's latents of
the training windows' real observations, decodes latents to proprio, and the Go2's kinematics
(`robot_drivers.go2.kinematics`) turn proprio into feet. The stance foot of a step is the real
lowest foot in the base frame; its horizontal speed in the world is the slip (near zero for a
foot that holds). Per model the table gives the held-out latent loss, the proprio error of the
decoded prediction, and for the stance foot the predicted vs the real slip speed, overall and on
the steps where the real foot slips. The `oracle` row decodes E of the real observations: what
a perfect f would give through the same probe (the probe's own error).

    simdist-slip --d-real OUT/simdist/d_real --checkpoint pretrained=CKPT \\
        --checkpoint adapted=OUT/simdist/registry/deployed --out slip.json --plot slip.png
"""

from __future__ import annotations

import argparse
import json
import pathlib
from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch.utils.data import DataLoader

from robot_drivers.go2.kinematics import Go2Kinematics
from simdist_adapter.episodes import COLLECT_SEED, GATE_EPISODES
from simdist_adapter.finetune import latent_loss, real_windows, window_batch
from simdist_planner.model.checkpoint import load_checkpoint

SLIP_SPEED = 0.1  # m/s: a stance foot moving faster than this over the ground slips
RIDGE = 1e-3


@dataclass(frozen=True)
class SlipRow:
    model: str
    heldout_latent_loss: float | None  # Eq. 3 on the held-out windows (None for the oracle)
    proprio_rmse: float  # decoded predicted proprio vs real, every term and step
    real_slip: float  # mean stance-foot horizontal speed, real (m/s)
    predicted_slip: float  # the same from the decoded prediction
    slip_mae: float  # mean |predicted - real| stance-foot speed
    slipping_steps: int  # steps whose real stance foot slips (> SLIP_SPEED)
    slipping_predicted: float  # share of those where the prediction slips too
    slipping_mae: float  # mean |predicted - real| on those steps


def _windows(model, windows, device) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Real future proprio (N, T, P), and per model key: latents of the real future and f's."""
    loader = DataLoader(windows, batch_size=64, shuffle=False, collate_fn=window_batch)
    real, targets, predicted = [], [], []
    h = model.config.history
    with torch.no_grad():
        for batch in loader:
            out = model.predict_window({k: v.to(device) for k, v in batch.items()})
            real.append(batch["proprio"][:, h + 1 :].numpy())
            targets.append(out["target_latents"].cpu().numpy())
            predicted.append(out["latents"].cpu().numpy())
    return np.concatenate(real), {
        "targets": np.concatenate(targets),
        "latents": np.concatenate(predicted),
    }


def _ridge(z: np.ndarray, y: np.ndarray) -> np.ndarray:
    x = np.c_[z, np.ones(len(z))]
    return np.linalg.solve(x.T @ x + RIDGE * np.eye(x.shape[1]), x.T @ y)


def _decode(w: np.ndarray, z: np.ndarray) -> np.ndarray:
    flat = z.reshape(-1, z.shape[-1])
    return (np.c_[flat, np.ones(len(flat))] @ w).reshape(z.shape[:-1] + (w.shape[1],))


def stance_slip(kin: Go2Kinematics, proprio: np.ndarray, stance: np.ndarray | None = None):
    """(stance foot index, its horizontal speed) per step of proprio (..., 35); `stance` given:
    that foot's speed (the real stance foot, read from a prediction)."""
    pos, vel = kin.feet(proprio)
    if stance is None:
        stance = np.argmin(pos[..., 2], axis=-1)
    speed = np.linalg.norm(vel[..., :2], axis=-1)
    return stance, np.take_along_axis(speed, stance[..., None], axis=-1)[..., 0]


def _row(name, loss, kin, real, stance, real_speed, decoded) -> SlipRow:
    _, speed = stance_slip(kin, decoded, stance)
    slipping = real_speed > SLIP_SPEED
    err = np.abs(speed - real_speed)
    return SlipRow(
        model=name,
        heldout_latent_loss=loss,
        proprio_rmse=float(np.sqrt(np.mean((decoded - real) ** 2))),
        real_slip=float(real_speed.mean()),
        predicted_slip=float(speed.mean()),
        slip_mae=float(err.mean()),
        slipping_steps=int(slipping.sum()),
        slipping_predicted=float((speed[slipping] > SLIP_SPEED).mean()) if slipping.any() else 0.0,
        slipping_mae=float(err[slipping].mean()) if slipping.any() else 0.0,
    )


def analyse(d_real, models: dict, gate_seeds: list[int], device="cpu"):
    """Rows per model (and the oracle) on the gate's held-out episodes (`gate_seeds`), plus the
    series of the window that slips most."""
    first = next(iter(models.values()))
    cfg = first.config
    train, held = real_windows(d_real, cfg.history, cfg.horizon, 0.5, 0, gate_seeds)
    kin = Go2Kinematics()
    real_train, enc_train = _windows(first, train, device)
    w = _ridge(
        enc_train["targets"].reshape(-1, cfg.latent_dim), real_train.reshape(-1, cfg.proprio_dim)
    )
    rows, series = [], {}
    real, enc = _windows(first, held, device)
    stance, real_speed = stance_slip(kin, real)
    worst = int(np.argmax(real_speed.max(axis=1)))
    series["real"] = real_speed[worst].tolist()
    oracle = _decode(w, enc["targets"])
    rows.append(_row("oracle", None, kin, real, stance, real_speed, oracle))
    series["oracle"] = stance_slip(kin, oracle[worst], stance[worst])[1].tolist()
    for name, model in models.items():
        _, out = _windows(model, held, device)
        decoded = _decode(w, out["latents"])
        loss = latent_loss(model, held, device=device)
        rows.append(_row(name, loss, kin, real, stance, real_speed, decoded))
        series[name] = stance_slip(kin, decoded[worst], stance[worst])[1].tolist()
    return rows, series


def format_table(rows: list[SlipRow]) -> str:
    lines = [
        f"{'model':12} {'latent loss':>11} {'proprio rmse':>12} {'slip real':>9} "
        f"{'predicted':>9} {'mae':>6} | {'slipping steps':>14} {'predicted':>9} {'mae':>6}"
    ]
    for r in rows:
        loss = "-" if r.heldout_latent_loss is None else f"{r.heldout_latent_loss:.4f}"
        lines.append(
            f"{r.model:12} {loss:>11} {r.proprio_rmse:12.4f} {r.real_slip:9.3f} "
            f"{r.predicted_slip:9.3f} {r.slip_mae:6.3f} | {r.slipping_steps:14d} "
            f"{r.slipping_predicted:9.0%} {r.slipping_mae:6.3f}"
        )
    return "\n".join(lines)


def plot(series: dict, path: pathlib.Path) -> None:
    import matplotlib  # noqa: PLC0415 - plots only; matplotlib is heavy to import

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 - plots only; matplotlib is heavy to import

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, values in series.items():
        style = "k-" if name == "real" else "--"
        ax.plot(values, style, marker="o" if name != "real" else None, label=name)
    ax.axhline(SLIP_SPEED, color="grey", lw=0.5)
    ax.set(
        xlabel="step into the future",
        ylabel="stance foot horizontal speed (m/s)",
        title="predicted vs real slip (held-out window)",
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="simdist-slip",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--d-real", required=True, help="D_real shards (an experiment's <method>/d_real)"
    )
    p.add_argument(
        "--checkpoint", action="append", required=True, help="NAME=PATH, repeatable (Go2 models)"
    )
    p.add_argument(
        "--gate-episodes",
        type=int,
        default=GATE_EPISODES,
        help="the experiment's gate episodes (the first this many collected), held out here",
    )
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", default=None, help="write the rows and the series here (JSON)")
    p.add_argument("--plot", default=None, help="PNG of the window that slips most")
    a = p.parse_args(argv)
    models = {}
    for spec in a.checkpoint:
        name, _, path = spec.rpartition("=")
        models[name or path] = load_checkpoint(path, device=a.device).eval()
    gate = list(range(COLLECT_SEED, COLLECT_SEED + a.gate_episodes))
    rows, series = analyse(a.d_real, models, gate, a.device)
    print(format_table(rows))
    if a.out:
        pathlib.Path(a.out).write_text(
            json.dumps({"rows": [asdict(r) for r in rows], "series": series}, indent=1)
        )
    if a.plot:
        plot(series, pathlib.Path(a.plot))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
