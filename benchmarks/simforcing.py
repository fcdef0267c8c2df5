"""SimForcing inference latency over (N_s, N_r, w) on this machine, for the --small backbone.

    python benchmarks/simforcing.py [--checkpoint runs/small/student_full] [--device cuda]

Without a checkpoint it times a randomly initialised backbone of the `--small` size (latency
does not depend on the weights). Prints seconds per sample (sim + real generation + decoding).
"""

import argparse

import torch

from sim_video_world_model.backbones import build_backbone
from sim_video_world_model.checkpoint import ModelBundle, load_bundle
from sim_video_world_model.config import BackboneConfig, TinyBackboneConfig
from sim_video_world_model.evaluate import EvalConfig, latency_grid


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--checkpoint")
    p.add_argument("--device", default="cpu")
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    if args.checkpoint:
        bundle = load_bundle(args.checkpoint, args.device)
        frames, (h, w) = bundle.info["num_frames"], bundle.info["image_size"]
    else:
        cfg = BackboneConfig(tiny=TinyBackboneConfig(spatial_factor=8, latent_channels=16))
        ae, den = build_backbone(cfg)
        den.add_sim_conditioning()
        bundle = ModelBundle(ae.to(args.device).eval(), den.to(args.device), cfg, {})
        frames, h, w = 9, 64, 64
    item = {
        "real": torch.rand(3, frames, h, w) * 2 - 1,
        "actions": torch.rand(frames - 1, bundle.backbone.action_dim),
        "mask": torch.ones(h, w, dtype=torch.bool),
    }
    rows = latency_grid(bundle, item, EvalConfig(device=args.device, latency_reps=args.reps))
    print(f"device {args.device}, {frames} frames at {h}x{w}")
    print("N_s  N_r    w   seconds/sample")
    for r in rows:
        print(f"{r['sim_steps']:>3}  {r['real_steps']:>3}  {r['w']:>3g}   {r['seconds']:.4f}")


if __name__ == "__main__":
    main()
