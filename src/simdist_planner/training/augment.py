"""Observation augmentation on the model inputs o_{t-H..t}: per-term Gaussian noise with the
dataset's stds, and for cameras brightness / contrast / shift per window."""

from __future__ import annotations

import torch

from simdist_planner.training.config import AugmentationConfig


def augment(
    batch: dict,
    aug: AugmentationConfig,
    proprio_noise: torch.Tensor,
    hm_noise: float,
    model_config,
    generator: torch.Generator,
) -> dict:
    """Noise on the inputs o_{t-H..t} (targets stay clean, as in the official dataset)."""
    out = dict(batch)
    history = model_config.history
    n_in = history + 1
    p = batch["proprio"].clone()
    p[:, :n_in] += torch.randn(p[:, :n_in].shape, generator=generator) * proprio_noise
    out["proprio"] = p
    if "height_map" in batch and hm_noise > 0:
        hm = batch["height_map"].clone()
        hm[:, :n_in] += torch.randn(hm[:, :n_in].shape, generator=generator) * hm_noise
        out["height_map"] = hm
    if "images" in batch:
        cameras = model_config.image.cameras
        movable = torch.tensor([c not in aug.fixed_cameras for c in cameras])
        out["images"] = augment_images(batch["images"], aug, history, generator, movable)
    return out


def augment_images(
    images: torch.Tensor,
    aug: AugmentationConfig,
    history: int,
    g: torch.Generator,
    movable: torch.Tensor,
) -> torch.Tensor:
    """Image augmentation per (window, camera); `movable` (n_cam,) bool: the cameras a shift
    may move.

    Brightness and contrast change only the current image o_t: the latent target sg(E(o_{t+i}))
    stays clean, which teaches E to ignore appearance. The random shift (a camera that moved) moves
    o_t AND the target frames o_{t+1..t+T} alike: shifting the input alone would make every
    position-dependent feature of E unpredictable, and the latent loss would then teach E to
    drop where objects are in the image. The history frames are left as they are (E reads only
    the latest image). Images keep their dtype: uint8 frames stay uint8 (what a camera gives), so
    the loader ships a quarter of the bytes and the model converts only the frames it reads.
    """
    x = images.clone()
    b, _, n_cam, _, h, w = x.shape
    top = 255.0 if x.dtype == torch.uint8 else 1.0
    cur = x[:, history].float()  # (B, n_cam, 3, h, w)
    bright = 1 + (torch.rand(b, n_cam, 1, 1, 1, generator=g) * 2 - 1) * aug.image_brightness
    contrast = 1 + (torch.rand(b, n_cam, 1, 1, 1, generator=g) * 2 - 1) * aug.image_contrast
    mean = cur.mean(dim=(2, 3, 4), keepdim=True)
    cur = (((cur - mean) * contrast + mean) * bright).clamp(0, top)
    x[:, history] = cur.round().to(x.dtype) if x.dtype == torch.uint8 else cur
    s = aug.image_shift
    if s > 0:
        # A shift by (dy, dx) in [-s, s] with the border pixels repeated: the source rows / cols
        # of every output pixel, per (window, camera).
        moves = movable.repeat(b)  # (B * n_cam,), camera-minor like x[:, t]
        dy = torch.randint(-s, s + 1, (b * n_cam,), generator=g)
        dx = torch.randint(-s, s + 1, (b * n_cam,), generator=g)
        rows = (torch.arange(h) + dy[:, None]).clamp(0, h - 1)  # (B * n_cam, h)
        cols = (torch.arange(w) + dx[:, None]).clamp(0, w - 1)
        for i in torch.nonzero(moves).flatten().tolist():
            k, c = divmod(i, n_cam)
            frames = x[k, history:, c]  # (T + 1, 3, h, w)
            x[k, history:, c] = frames.index_select(2, rows[i]).index_select(3, cols[i])
    return x
