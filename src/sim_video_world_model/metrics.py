"""Video prediction metrics. Videos are (N, 3, T, H, W) in [-1, 1].

PSNR / SSIM: torchmetrics, per frame, averaged. LPIPS (AlexNet features + learned linear heads),
FID (Inception-v3 pool features) and FVD (video features, Frechet distance) need pretrained weights:
they load them from LOCAL files (safetensors, or a PyTorch state dict read with weights_only=True)
and are skipped when none are given. Deviation: torchvision has no I3D, so FVD uses torchvision's
R3D-18 Kinetics network; pass its weights to get comparable-in-spirit (not paper-identical) numbers.

Motion-aware scores (a whole-frame score on a mostly static scene rewards copying the first frame):
- The motion mask of a ground-truth video marks, per frame, the pixels whose colour differs from
  the first frame, with the frame's camera gain taken out (`frame_gains`), by more than a threshold
  in some channel (pixels in [0, 1]): a gain change alone moves no pixel. The threshold comes from
  the measured camera noise of real videos (`measure_noise`: NOISE_SIGMAS robust standard
  deviations of the gain-compensated differences). It is computed from the REAL frames only, so
  every prediction of a window is scored on the same pixels. `masked_psnr` / `masked_ssim` /
  `LPIPS(..., mask=)` average over those pixels only.
- On the other pixels (static in the real video): `masked_psnr` again, and `static_changed`, the
  share of them that a prediction changes by more than the threshold (motion it invents).
- `FirstFrameColourSegmenter` labels robot pixels in any frame from the given observation alone
  (the first real frame and its joint-state robot mask); `centroid_error` is the distance in pixels
  between the centroids of the robot pixels in the predicted and in the real frames.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn
from torchmetrics.functional.image import (
    peak_signal_noise_ratio,
    structural_similarity_index_measure,
)
from torchvision.models import alexnet, inception_v3
from torchvision.models.video import r3d_18

# Colour change (pixels in [0, 1]) that marks a pixel as moving where no measured threshold is
# given (the segmenter's default, the sim stream of `motion_gap`): about 4.5 standard deviations of
# the difference of two frames under the real stream's pixel noise (4/255).
MOTION_THRESHOLD = 0.1
# A measured threshold is this many robust standard deviations of the gain-compensated frame
# differences: a Gaussian crosses it with probability 6e-7 per channel.
NOISE_SIGMAS = 5.0
# First-frame values whose ratio x_t / x_0 estimates a frame's gain: not dark (a ratio of noise),
# not near saturation (clipped, so the gain does not show).
GAIN_RANGE = (0.1, 0.95)
MAX_PSNR = 100.0  # identical frames (or masked pixels): PSNR capped at 100 dB


def _frames01(video: torch.Tensor) -> torch.Tensor:
    if video.ndim != 5 or video.shape[1] != 3:
        raise ValueError(f"videos must be (N, 3, T, H, W), got {tuple(video.shape)}")
    return ((video.float() + 1.0) / 2.0).clamp(0, 1).transpose(1, 2).flatten(0, 1)


def _check_pair(pred: torch.Tensor, target: torch.Tensor) -> None:
    if pred.shape != target.shape:
        raise ValueError(f"prediction {tuple(pred.shape)} and target {tuple(target.shape)} differ")


def psnr(pred: torch.Tensor, target: torch.Tensor) -> float:
    _check_pair(pred, target)
    p, t = _frames01(pred), _frames01(target)
    per_frame = peak_signal_noise_ratio(p, t, data_range=1.0, reduction="none", dim=(1, 2, 3))
    return float(per_frame.clamp(max=MAX_PSNR).mean())


def ssim(pred: torch.Tensor, target: torch.Tensor) -> float:
    _check_pair(pred, target)
    score = structural_similarity_index_measure(_frames01(pred), _frames01(target), data_range=1.0)
    assert isinstance(score, torch.Tensor)  # a tuple only with return_full_image (not asked)
    return float(score)


def _videos01(video: torch.Tensor) -> torch.Tensor:
    if video.ndim != 5 or video.shape[1] != 3:
        raise ValueError(f"videos must be (N, 3, T, H, W), got {tuple(video.shape)}")
    return (video.float() + 1.0) / 2.0


def frame_gains(target: torch.Tensor) -> torch.Tensor:
    """(N, T) gain of each frame relative to the first: the median of x_t / x_0 over the pixels
    and channels whose first-frame value lies in GAIN_RANGE (1 where there are none). Most of a
    frame is static, so the median is the camera's gain change, not the motion."""
    x = _videos01(target)
    x0 = x[:, :, :1].expand_as(x)
    usable = (x0 > GAIN_RANGE[0]) & (x0 < GAIN_RANGE[1])
    ratio = torch.where(usable, x / x0.clamp_min(1e-6), torch.full_like(x, float("nan")))
    gains = ratio.transpose(1, 2).flatten(2).nanmedian(dim=-1).values
    return torch.nan_to_num(gains, nan=1.0)


def change_from_first(video: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """(N, T, H, W): max over channels of |video_t - r_t target_0|, r_t the target's frame gains
    (pixels in [0, 1]); for video = target, how far each real pixel moved beyond the gain."""
    _check_pair(video, target)
    x, ref = _videos01(video), _videos01(target)
    expected = ref[:, :, :1] * frame_gains(target)[:, None, :, None, None]
    return (x - expected).abs().amax(dim=1)


def motion_mask(
    target: torch.Tensor, threshold: float = MOTION_THRESHOLD, compensate_gain: bool = True
) -> torch.Tensor:
    """(N, T, H, W) bool: the pixels whose colour differs from the first frame by more than
    `threshold` in some channel, the frame's gain taken out (`frame_gains`; `compensate_gain=False`
    compares the raw colours, for streams without a camera gain); frame 0: all False."""
    if compensate_gain:
        return change_from_first(target, target) > threshold
    x = _videos01(target)
    return (x - x[:, :, :1]).abs().amax(dim=1) > threshold


def measure_noise(target: torch.Tensor, start: int = 1) -> dict[str, float]:
    """The camera noise of real videos, frames start..T-1: `sigma`, the robust standard deviation
    (1.4826 x the median absolute deviation) of the gain-compensated differences x_t - r_t x_0 over
    every pixel and channel (the moving few do not shift a median); `gain_jitter`, the standard
    deviation of the frame gains r_t; `threshold` = NOISE_SIGMAS x sigma, the motion threshold."""
    x = _videos01(target)
    gains = frame_gains(target)
    diff = (x - x[:, :, :1] * gains[:, None, :, None, None])[:, :, start:].flatten()
    sigma = float(1.4826 * (diff - diff.median()).abs().median())
    return {
        "sigma": sigma,
        "gain_jitter": float(gains[:, start:].std()),
        "threshold": NOISE_SIGMAS * sigma,
    }


def static_changed(
    pred: torch.Tensor,
    target: torch.Tensor,
    moving: torch.Tensor,
    threshold: float,
    start: int = 1,
) -> float:
    """Over frames start..T-1, the share of the pixels where the real video does not move
    (`~moving`, (N, T, H, W)) that the prediction changes by more than `threshold` from the real
    first frame at the real frame's gain: motion the prediction invents. NaN when every pixel
    moves."""
    if moving.shape != (target.shape[0], *target.shape[2:]):
        raise ValueError(f"mask {tuple(moving.shape)} does not fit video {tuple(target.shape)}")
    static = ~moving[:, start:]
    if not static.any():
        return float("nan")
    changed = change_from_first(pred, target)[:, start:] > threshold
    return float(changed[static].float().mean())


def _frame_masks(mask: torch.Tensor, video: torch.Tensor) -> torch.Tensor:
    """(N, T, H, W) bool -> (N*T, 1, H, W) float, frame order of `_frames01`."""
    if mask.shape != (video.shape[0], *video.shape[2:]):
        raise ValueError(f"mask {tuple(mask.shape)} does not fit video {tuple(video.shape)}")
    return mask.flatten(0, 1)[:, None].float()


def masked_psnr(pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> float:
    """PSNR per frame over the masked pixels (all channels), averaged over the frames with at least
    one masked pixel; NaN when the mask is empty everywhere."""
    _check_pair(pred, target)
    m = _frame_masks(mask, pred)
    count = m.sum(dim=(1, 2, 3)) * 3
    sq = ((_frames01(pred) - _frames01(target)).pow(2) * m).sum(dim=(1, 2, 3))
    keep = count > 0
    if not keep.any():
        return float("nan")
    mse = sq[keep] / count[keep]
    per_frame = (10 * torch.log10(1.0 / mse.clamp_min(1e-30))).clamp(max=MAX_PSNR)
    return float(per_frame.mean())


def masked_ssim(pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean of the SSIM map (torchmetrics, full image) over the masked pixels; NaN for an empty
    mask."""
    _check_pair(pred, target)
    m = _frame_masks(mask, pred)
    if not m.any():
        return float("nan")
    _, ssim_map = structural_similarity_index_measure(
        _frames01(pred), _frames01(target), data_range=1.0, return_full_image=True
    )
    return float((ssim_map * m).sum() / (m.sum() * ssim_map.shape[1]))


class FirstFrameColourSegmenter:
    """Robot pixels of any frame of a window, from the given observation alone.

    Reference: the window's first REAL frame x_0 and its robot mask M_0 (the joint-state mask every
    window carries). In frame t, a pixel whose colour differs from x_0 by at most
    `change_threshold` (every channel, pixels in [0, 1]) keeps its frame-0 label; a changed pixel is
    robot when its colour is nearer (Euclidean, RGB) to the robot's frame-0 colours than to the
    background's (1-nearest neighbour over at most `palette` colours of each, evenly subsampled).
    So a robot that does not move keeps exactly M_0, a robot that moves over a static background is
    found where it arrives, and the background it uncovers is not robot. It assumes a static scene
    apart from the robot and robot colours that the background does not share.
    """

    def __init__(self, change_threshold: float = MOTION_THRESHOLD, palette: int = 256):
        self.change_threshold, self.palette = change_threshold, palette

    def _palette(self, colours: torch.Tensor) -> torch.Tensor:  # (K, 3) -> (<= palette, 3)
        if colours.shape[0] <= self.palette:
            return colours
        return colours[torch.linspace(0, colours.shape[0] - 1, self.palette).long()]

    @torch.no_grad()
    def __call__(
        self, video: torch.Tensor, first_frame: torch.Tensor, first_mask: torch.Tensor
    ) -> torch.Tensor:
        """video (N, 3, T, H, W), first_frame (N, 3, H, W) in [-1, 1], first_mask (N, H, W) bool
        -> robot masks (N, T, H, W) bool."""
        x = (video.float() + 1.0) / 2.0
        ref = (first_frame.float() + 1.0) / 2.0
        m0 = first_mask.bool().to(video.device)
        changed = (x - ref[:, :, None]).abs().amax(dim=1) > self.change_threshold
        out = m0[:, None].expand_as(changed).clone()
        for n in range(x.shape[0]):
            if not changed[n].any():
                continue
            colours = ref[n].flatten(1).T  # (H*W, 3)
            flat_mask = m0[n].flatten()
            if not flat_mask.any() or flat_mask.all():
                out[n][changed[n]] = bool(flat_mask.any())
                continue
            robot = self._palette(colours[flat_mask])
            background = self._palette(colours[~flat_mask])
            pixels = x[n].permute(1, 2, 3, 0)[changed[n]]  # (K, 3)
            is_robot = torch.cdist(pixels, robot).amin(1) < torch.cdist(pixels, background).amin(1)
            out[n][changed[n]] = is_robot
        return out


def centroids(masks: torch.Tensor, fallback: torch.Tensor | None = None) -> torch.Tensor:
    """(N, T, H, W) bool -> (N, T, 2) pixel centroids (x, y); an empty mask takes `fallback`
    ((N, 2), e.g. the frame-0 centroid) or NaN."""
    n, t, h, w = masks.shape
    m = masks.float()
    count = m.sum(dim=(2, 3))
    ys = torch.arange(h, dtype=torch.float32, device=masks.device)
    xs = torch.arange(w, dtype=torch.float32, device=masks.device)
    cx = (m.sum(2) * xs).sum(-1) / count.clamp_min(1)
    cy = (m.sum(3) * ys).sum(-1) / count.clamp_min(1)
    c = torch.stack([cx, cy], dim=-1)
    empty = (count == 0)[..., None]
    fill = (
        torch.full_like(c, float("nan"))
        if fallback is None
        else fallback[:, None].expand_as(c).to(c.dtype)
    )
    return torch.where(empty, fill, c)


def robot_tracking(
    pred: torch.Tensor,
    target: torch.Tensor,
    first_mask: torch.Tensor,
    start: int = 1,
    segmenter: FirstFrameColourSegmenter | None = None,
) -> tuple[float, float]:
    """(centroid error, found fraction) over the frames start..T-1.

    Centroid error: the mean distance (pixels) between the robot centroids of the predicted and
    the real frames, both segmented against the REAL first frame and its mask (`segmenter`,
    default `FirstFrameColourSegmenter()`); a frame where no robot pixel is found counts as the
    robot at its frame-0 position. Found fraction: the share of the predicted frames where robot
    pixels are found at all (a low one means the error is mostly that fallback). Windows with an
    empty first mask are left out (NaN, NaN if all are)."""
    _check_pair(pred, target)
    segmenter = segmenter or FirstFrameColourSegmenter()
    first = target[:, :, 0]
    m0 = first_mask.bool()
    keep = m0.flatten(1).any(1)
    if not keep.any():
        return float("nan"), float("nan")
    c0 = centroids(m0[keep, None])[:, 0]
    pred_masks = segmenter(pred[keep], first[keep], m0[keep])
    c_pred = centroids(pred_masks, fallback=c0)
    c_real = centroids(segmenter(target[keep], first[keep], m0[keep]), fallback=c0)
    error = float((c_pred - c_real)[:, start:].norm(dim=-1).mean())
    found = float(pred_masks[:, start:].flatten(2).any(2).float().mean())
    return error, found


def centroid_error(
    pred: torch.Tensor,
    target: torch.Tensor,
    first_mask: torch.Tensor,
    start: int = 1,
    segmenter: FirstFrameColourSegmenter | None = None,
) -> float:
    """The centroid error of `robot_tracking` (pixels)."""
    return robot_tracking(pred, target, first_mask, start, segmenter)[0]


def read_state(path: str) -> dict[str, torch.Tensor]:
    """Local weights only: safetensors or a plain state dict (torch.load with weights_only=True)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"metric weights not found: {path}")
    if path.endswith(".safetensors"):
        return load_file(path)
    return torch.load(path, map_location="cpu", weights_only=True)


def load_weights(
    module: nn.Module, path: str, drop_prefixes: tuple[str, ...] = (), strip: str = ""
) -> nn.Module:
    state = read_state(path)
    if strip and any(k.startswith(strip) for k in state):
        state = {k[len(strip) :]: v for k, v in state.items() if k.startswith(strip)}
    state = (
        {k: v for k, v in state.items() if not k.startswith(drop_prefixes)}
        if drop_prefixes
        else state
    )
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as err:
        raise ValueError(f"{path} does not fit {type(module).__name__}: {err}") from err
    return module


class LPIPS(nn.Module):
    """Learned perceptual distance: unit-normalised AlexNet features, squared differences weighted
    per channel by non-negative 1x1 heads, spatially averaged, summed over the 5 layers."""

    CHANNELS = (64, 192, 384, 256, 256)
    TAPS = (1, 4, 7, 9, 11)  # ReLU outputs in torchvision's alexnet.features
    shift: torch.Tensor  # (1, 3, 1, 1) buffers: [-1, 1] input -> the backbone's normalisation
    scale: torch.Tensor

    def __init__(self, backbone_weights: str | None = None, head_weights: str | None = None):
        super().__init__()

        self.features = alexnet(weights=None).features
        if backbone_weights:
            load_weights(
                self.features, backbone_weights, strip="features."
            )  # full AlexNet or features only
        heads = [nn.Conv2d(c, 1, 1, bias=False) for c in self.CHANNELS]
        for h in heads:
            nn.init.uniform_(h.weight, 0.0, 1.0 / h.in_channels)
        self.heads = nn.ModuleList(heads)
        if head_weights:
            load_weights(self.heads, head_weights)
        self.register_buffer("shift", torch.tensor([-0.030, -0.088, -0.188]).view(1, 3, 1, 1))
        self.register_buffer("scale", torch.tensor([0.458, 0.448, 0.450]).view(1, 3, 1, 1))
        self.requires_grad_(False).eval()

    def _taps(self, x: torch.Tensor) -> list[torch.Tensor]:
        out = []
        for i, layer in enumerate(self.features):
            x = layer(x)
            if i in self.TAPS:
                out.append(x / (x.pow(2).sum(dim=1, keepdim=True).sqrt() + 1e-10))
            if i == self.TAPS[-1]:
                break
        return out

    @torch.no_grad()
    def forward(
        self, pred: torch.Tensor, target: torch.Tensor, mask: torch.Tensor | None = None
    ) -> float:
        """Mean LPIPS over all frames of two (N, 3, T, H, W) videos in [-1, 1]; with `mask`
        ((N, T, H, W) bool), each layer's distance map is upsampled to the frame size and averaged
        over the masked pixels only (NaN for an empty mask)."""
        _check_pair(pred, target)
        if mask is not None:
            return self._masked(pred, target, _frame_masks(mask, pred))
        p, t = self._inputs(pred, target)
        dist = sum(
            head((fp - ft) ** 2).mean(dim=(1, 2, 3))
            for head, fp, ft in zip(self.heads, self._taps(p), self._taps(t))
        )
        return float(dist.mean())

    def _inputs(self, pred: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, ...]:
        p = (_frames01(pred) * 2 - 1 - self.shift) / self.scale
        t = (_frames01(target) * 2 - 1 - self.shift) / self.scale
        size = max(64, p.shape[-1])
        return tuple(
            F.interpolate(v, size=(size, size), mode="bilinear", align_corners=False)
            for v in (p, t)
        )

    def _masked(self, pred: torch.Tensor, target: torch.Tensor, m: torch.Tensor) -> float:
        if not m.any():
            return float("nan")
        p, t = self._inputs(pred, target)
        dist = sum(
            F.interpolate(
                head((fp - ft) ** 2), size=m.shape[-2:], mode="bilinear", align_corners=False
            )
            for head, fp, ft in zip(self.heads, self._taps(p), self._taps(t))
        )
        return float((dist * m).sum() / m.sum())


def frechet_distance(a: torch.Tensor, b: torch.Tensor) -> float:
    """||mu_a - mu_b||^2 + tr(S_a + S_b - 2 (S_a S_b)^1/2) of two feature sets (N, D), in float64.

    With centred, scaled features A, B (S_a = A^T A), tr (S_a S_b)^1/2 is the nuclear norm of
    A B^T: an (N_a x N_b) SVD instead of D x D eigenproblems when there are fewer samples than
    feature dimensions (the usual case for Inception's 2048-d features on a held-out set).
    """
    if a.shape[0] < 2 or b.shape[0] < 2:
        raise ValueError("the Frechet distance needs at least 2 samples per set")
    a, b = a.double(), b.double()
    mu_a, mu_b = a.mean(0), b.mean(0)
    A = (a - mu_a) / (a.shape[0] - 1) ** 0.5
    B = (b - mu_b) / (b.shape[0] - 1) ** 0.5
    if max(a.shape[0], b.shape[0]) <= a.shape[1]:
        cross = torch.linalg.svdvals(A @ B.T).sum()
    else:
        s_a, s_b = A.T @ A, B.T @ B
        ev, vecs = torch.linalg.eigh(s_a)
        root_a = vecs @ torch.diag(ev.clamp_min(0).sqrt()) @ vecs.T
        cross = torch.linalg.eigvalsh(root_a @ s_b @ root_a).clamp_min(0).sqrt().sum()
    value = (mu_a - mu_b).pow(2).sum() + A.pow(2).sum() + B.pow(2).sum() - 2 * cross
    return float(value.clamp_min(0.0))


class FrechetInceptionDistance(nn.Module):
    """FID on all frames: Inception-v3 2048-d pool features at 299x299 (`size`), ImageNet norm."""

    mean: torch.Tensor  # (1, 3, 1, 1) normalisation buffers
    std: torch.Tensor

    def __init__(self, weights: str | None = None, size: int = 299):
        super().__init__()

        if size < 75:
            raise ValueError(f"Inception-v3 needs inputs of at least 75x75, got size {size}")
        self.size = size
        net = inception_v3(weights=None, aux_logits=False, init_weights=False)
        if weights:
            load_weights(net, weights, drop_prefixes=("AuxLogits.",))
        net.fc = nn.Identity()
        self.net = net.requires_grad_(False).eval()
        self.register_buffer("mean", torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1))

    @torch.no_grad()
    def features(self, video: torch.Tensor) -> torch.Tensor:
        x = F.interpolate(
            _frames01(video), size=(self.size, self.size), mode="bilinear", align_corners=False
        )
        return torch.cat([self.net((c - self.mean) / self.std) for c in x.split(16)])

    def forward(self, pred: torch.Tensor, target: torch.Tensor) -> float:
        return frechet_distance(self.features(pred), self.features(target))


class FrechetVideoDistance(nn.Module):
    """FVD: Frechet distance of whole-clip features (torchvision R3D-18 at 112x112 (`size`),
    Kinetics normalisation)."""

    mean: torch.Tensor  # (1, 3, 1, 1, 1) normalisation buffers
    std: torch.Tensor

    def __init__(self, weights: str | None = None, size: int = 112):
        super().__init__()

        self.size = size
        net = r3d_18(weights=None)
        if weights:
            load_weights(net, weights)
        net.fc = nn.Identity()
        self.net = net.requires_grad_(False).eval()
        self.register_buffer("mean", torch.tensor([0.43216, 0.394666, 0.37645]).view(1, 3, 1, 1, 1))
        self.register_buffer("std", torch.tensor([0.22803, 0.22145, 0.216989]).view(1, 3, 1, 1, 1))

    @torch.no_grad()
    def features(self, video: torch.Tensor) -> torch.Tensor:
        n, _, t = video.shape[:3]
        frames = F.interpolate(
            _frames01(video), size=(self.size, self.size), mode="bilinear", align_corners=False
        )
        clips = frames.view(n, t, 3, self.size, self.size).transpose(1, 2)
        return self.net((clips - self.mean) / self.std)

    def forward(self, pred: torch.Tensor, target: torch.Tensor) -> float:
        return frechet_distance(self.features(pred), self.features(target))
