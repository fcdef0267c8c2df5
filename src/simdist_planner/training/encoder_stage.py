"""An optional first stage of pretraining: teach E's image backbone to read the task state.

The paper's UR5e encoder starts from ImageNet ResNet-18 features; this machine has no ImageNet
weights, and the small CNN trained only through Eq. 2 (with the auxiliary state loss on z) places
the peg at the hole to 4-8 mm where the hole's clearance is 1 mm. The same CNN trained on the
cameras and the proprio to predict the privileged task state alone reads it to about 2 mm
(docs/notebook/peg_wide.md). So, before Eq. 2, the backbone may first learn that
(`PretrainConfig.encoder_stage`), and stay fixed afterwards (`EncoderStage.freeze_backbone`), the
way a pretrained feature extractor is used. The reader head is thrown away; only the backbone's
weights go on into the world model.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from simdist_planner.model.losses import near_field_slices, state_targets
from simdist_planner.model.transformers import MLP
from simdist_planner.model.world_model import WorldModel
from simdist_planner.training.augment import augment_images
from simdist_planner.training.config import EncoderStage, PretrainConfig
from simdist_planner.training.sampler import step_seed


class StateReader(nn.Module):
    """Every camera's backbone features plus the normalised proprio -> the state targets."""

    def __init__(self, model: WorldModel, out_dim: int, hidden: int = 256):
        super().__init__()
        images = model.encoder.images
        if images is None:
            raise ValueError(f"the {model.config.robot} world model has no image encoder")
        self.images = images
        self.head = MLP(self.images.out_features + model.config.proprio_dim, [hidden], out_dim)

    def forward(self, images: torch.Tensor, proprio_n: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cat([self.images(images), proprio_n], dim=-1))


def _rows(source, picks: np.ndarray, names: list[str]) -> dict[str, np.ndarray]:
    """Step t of each picked window: {name: (len(picks), ...)}."""
    windows = source.windows
    data = windows.dataset
    rows = [
        data.read(
            int(windows.episode_index[i]),
            int(windows.t_index[i]),
            int(windows.t_index[i]) + 1,
            names,
        )
        for i in picks
    ]
    return {n: np.concatenate([r[n] for r in rows]) for n in names}


def encoder_lr(stage: EncoderStage, step: int) -> float:
    """Linear warm-up over the first 5 % of the stage, then cosine to a tenth."""
    warm = max(1, stage.steps // 20)
    if step < warm:
        return stage.learning_rate * (step + 1) / warm
    progress = (step - warm) / max(1, stage.steps - warm)
    return stage.learning_rate * (0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, progress))))


def pretrain_image_backbone(
    model: WorldModel,
    source,
    cfg: PretrainConfig,
    device: torch.device,
    rank: int = 0,
    writer=None,
    progress: bool = True,
) -> tuple[StateReader, list[float]]:
    """Train model.encoder.images (with a reader head) to predict the task state of step t of
    windows drawn as pretraining draws them (phase weights included), the images and proprio
    augmented as there. The scaler must be fitted. Returns the reader (its head is what the
    world model throws away) and the mean loss of every `log_every` steps."""
    mc, stage, aug = model.config, cfg.encoder_stage, cfg.augmentation
    if stage is None:
        raise ValueError("pretrain_image_backbone: the run has no encoder_stage")
    if source.windows is None or mc.image is None or mc.state_dim == 0:
        raise ValueError(
            "encoder_steps need a dataset with camera images and the task state "
            "(loss.state > 0), to teach the image backbone to read it"
        )
    layout = source.windows.dataset.layout
    near = near_field_slices(layout, stage.near_field, "encoder_near_field")
    out_dim = mc.state_dim + sum(c.stop - c.start for c, _ in near)
    torch.manual_seed(step_seed(cfg.seed, 3))
    reader = StateReader(model, out_dim).to(device)
    optimizer = torch.optim.Adam(reader.parameters(), lr=encoder_lr(stage, 0))
    names = ["proprio", "state", *(f"images/{c}" for c in mc.image.cameras)]
    movable = torch.tensor([c not in aug.fixed_cameras for c in mc.image.cameras])
    noise = source.proprio_noise()

    bar = tqdm(
        total=stage.steps,
        disable=not progress or rank != 0,
        desc="encoder",
        dynamic_ncols=True,
    )
    reader.train()
    total, count, losses = 0.0, 0, []
    for step in range(stage.steps):
        rows = _rows(
            source,
            source.draw(np.random.default_rng(step_seed(cfg.seed, rank, step, 4)), cfg.batch_size),
            names,
        )
        images = torch.from_numpy(np.stack([rows[f"images/{c}"] for c in mc.image.cameras], 1))
        images = images.permute(0, 1, 4, 2, 3).unsqueeze(1)  # (B, 1, n_cam, 3, h, w): one frame
        proprio = torch.from_numpy(rows["proprio"])
        if aug.enabled:
            g = torch.Generator().manual_seed(step_seed(cfg.seed, rank, step, 5))
            images = augment_images(images, aug, 0, g, movable)
            proprio = proprio + torch.randn(proprio.shape, generator=g) * noise
        images, proprio = images[:, 0].to(device), proprio.to(device)
        state = torch.from_numpy(rows["state"]).to(device)
        for group in optimizer.param_groups:
            group["lr"] = encoder_lr(stage, step)
        loss = F.mse_loss(
            reader(images, model.scaler.normalize("proprio", proprio)),
            state_targets(model.scaler, state, near),
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        value = float(loss.detach())
        if not math.isfinite(value):
            raise FloatingPointError(f"encoder stage: loss became {value} at step {step}")
        total, count = total + value, count + 1
        bar.update(1)
        if (step + 1) % cfg.log_every == 0 or step + 1 == stage.steps:
            losses.append(total / count)
            if writer is not None:
                writer.add_scalar("encoder/loss", losses[-1], step + 1)
                writer.add_scalar("encoder/lr", encoder_lr(stage, step), step + 1)
            bar.set_postfix(loss=f"{losses[-1]:.4f}")
            total, count = 0.0, 0
    bar.close()
    return reader.eval(), losses
