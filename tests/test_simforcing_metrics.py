"""Motion-aware video metrics on synthetic videos whose answers are known."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from sim_video_world_model import metrics
from sim_video_world_model.evaluate import Scorer, baseline_predictions, format_markdown
from sim_video_world_model.paired_data import (
    SyntheticArmWorld,
    SyntheticWorldConfig,
    add_camera_noise,
)

SIZE, FRAMES, SQUARE, SPEED = 32, 5, 6, 2  # a 6x6 square moving 2 px right per frame
RED = torch.tensor([1.0, 0.1, 0.1])


def background(n: int) -> torch.Tensor:
    """(n, 3, H, W) in [0, 1]: a smooth static green/blue texture, far from the square's red."""
    yy, xx = torch.meshgrid(torch.arange(SIZE), torch.arange(SIZE), indexing="ij")
    tex = 0.5 + 0.5 * torch.sin(xx / 3.0) * torch.cos(yy / 4.0)
    img = torch.stack([0.1 * tex, 0.2 + 0.3 * tex, 0.5 - 0.3 * tex])
    return img[None].repeat(n, 1, 1, 1)


def square_video(offsets: list[tuple[int, int]], n: int = 2) -> torch.Tensor:
    """(n, 3, T, H, W) in [-1, 1]: the square's top-left corner at offsets[t] = (x, y)."""
    frames = []
    for x, y in offsets:
        img = background(n)
        img[:, :, y : y + SQUARE, x : x + SQUARE] = RED[None, :, None, None]
        frames.append(img)
    return torch.stack(frames, dim=2) * 2 - 1


def real_offsets(dx: int = 0, dy: int = 0) -> list[tuple[int, int]]:
    return [(4 + SPEED * t + dx, 10 + dy) for t in range(FRAMES)]


def first_mask(n: int = 2) -> torch.Tensor:
    mask = torch.zeros(n, SIZE, SIZE, dtype=torch.bool)
    x, y = real_offsets()[0]
    mask[:, y : y + SQUARE, x : x + SQUARE] = True
    return mask


def test_copying_the_first_frame_scores_well_on_the_whole_frame_and_badly_on_moving_pixels():
    real = square_video(real_offsets())
    copy = real[:, :, :1].expand_as(real).clone()
    moving = metrics.motion_mask(real)
    # frame 0 never moves; frame t moves where the square left or arrived: 2 * (2t x 6) pixels
    assert not moving[:, 0].any()
    assert [int(moving[0, t].sum()) for t in range(1, FRAMES)] == [
        2 * min(SPEED * t, SQUARE) * SQUARE for t in range(1, FRAMES)
    ]
    p, g, m = copy[:, :, 1:], real[:, :, 1:], moving[:, 1:]
    whole, on_moving = metrics.psnr(p, g), metrics.masked_psnr(p, g, m)
    # the moving pixels' MSE is the whole frame's over the moving fraction (<= 72 / 1024 here)
    assert whole > 15.0 and on_moving < 6.0 and whole - on_moving > 10.0
    assert metrics.ssim(p, g) > 0.8 and metrics.masked_ssim(p, g, m) < 0.5


def test_a_perfect_prediction_scores_the_cap_and_zero_error():
    real = square_video(real_offsets())
    moving = metrics.motion_mask(real)[:, 1:]
    p = real[:, :, 1:].clone()
    assert metrics.masked_psnr(p, real[:, :, 1:], moving) == metrics.MAX_PSNR
    assert metrics.masked_ssim(p, real[:, :, 1:], moving) == pytest.approx(1.0, abs=1e-5)
    assert metrics.centroid_error(real.clone(), real, first_mask()) == pytest.approx(0.0, abs=1e-6)


def test_empty_motion_masks_give_nan_not_a_number_from_nothing():
    still = square_video([real_offsets()[0]] * FRAMES)
    moving = metrics.motion_mask(still)
    assert not moving.any()
    assert math.isnan(metrics.masked_psnr(still, still, moving))
    assert math.isnan(metrics.masked_ssim(still, still, moving))
    assert math.isnan(metrics.LPIPS()(still, still, mask=moving))
    # in the evaluation table: None (null in results.json, n/a in results.md)
    scores = Scorer(motion_threshold=metrics.MOTION_THRESHOLD)(still, still, first_mask(), start=1)
    assert scores["psnr_moving"] is None and scores["ssim_moving"] is None
    assert scores["psnr"] == metrics.MAX_PSNR and scores["centroid_px"] == 0.0
    assert scores["psnr_static"] == metrics.MAX_PSNR and scores["static_changed"] == 0.0
    result = {
        "split": "validation",
        "windows": 2,
        "episodes": 1,
        "noise": metrics.measure_noise(still),
        "sim_steps": 1,
        "real_steps": 1,
        "device": "cpu",
        "scored_frames": [1, FRAMES - 1],
        "context_frames": 1,
        "guidance_sweep": [0.0],
        "motion_threshold": metrics.MOTION_THRESHOLD,
        "moving_pixel_fraction": 0.0,
        "table": [{"method": "copy", **scores}],
        "latency": [],
    }
    row = format_markdown(result).splitlines()[-1]
    assert row.startswith("| copy | 100.0000 |") and "| n/a | n/a | 100.0000 |" in row


def test_centroid_error_of_a_shifted_square_equals_the_shift():
    real, mask = square_video(real_offsets()), first_mask()
    shifted = square_video(real_offsets(dx=3, dy=-1))
    # the prediction is segmented against the REAL first frame: its own frame 0 does not count
    assert metrics.centroid_error(shifted, real, mask) == pytest.approx(math.hypot(3, 1), abs=1e-5)
    copy = real[:, :, :1].expand_as(real).clone()
    mean_shift = SPEED * np.mean(np.arange(1, FRAMES))
    assert metrics.centroid_error(copy, real, mask) == pytest.approx(mean_shift, abs=1e-5)
    # from frame 3 on: only the frames scored count
    assert metrics.centroid_error(copy, real, mask, start=3) == pytest.approx(SPEED * 3.5, abs=1e-5)
    assert metrics.robot_tracking(shifted, real, mask)[1] == 1.0
    # a prediction without the robot: found in no frame, placed at its frame-0 position
    blank = square_video(real_offsets())
    blank[:, :, 1:] = background(2)[:, :, None] * 2 - 1
    error, found = metrics.robot_tracking(blank, real, mask)
    assert found == 0.0 and error == pytest.approx(mean_shift, abs=1e-5)


def test_segmenter_follows_the_square_under_camera_noise():
    torch.manual_seed(0)
    real = square_video(real_offsets())
    noisy = (real + 2 * (4 / 255) * torch.randn_like(real)).clamp(-1, 1)
    masks = metrics.FirstFrameColourSegmenter()(noisy, noisy[:, :, 0], first_mask())
    truth = metrics.motion_mask(real).new_zeros(masks.shape)
    for t, (x, y) in enumerate(real_offsets()):
        truth[:, t, y : y + SQUARE, x : x + SQUARE] = True
    assert torch.equal(masks, truth)
    # camera noise alone marks (almost) nothing as moving
    still = square_video([real_offsets()[0]] * FRAMES)
    still = (still + 2 * (4 / 255) * torch.randn_like(still)).clamp(-1, 1)
    assert metrics.motion_mask(still).float().mean() < 0.002


def test_segmenter_matches_the_synthetic_arm_worlds_own_masks():
    """The segmenter, given only frame 0 and its mask, tracks the textured "real" arm world."""
    cfg = SyntheticWorldConfig(size=64)
    rng = np.random.default_rng(3)
    ious = []
    for _ in range(3):
        world = SyntheticArmWorld(cfg, "real", rng)
        world.reset(np.array([0.3, 0.4], np.float32))
        frames, truth = [], []
        for i in range(FRAMES):
            if i:
                world.step(np.array([1.0, 0.6, 0, 0, 0, 0, -1], np.float32))
            frames.append(world.render())
            truth.append(world.robot_mask())
        video = torch.from_numpy(add_camera_noise(np.stack(frames), rng)).float() / 127.5 - 1
        video = video.permute(3, 0, 1, 2)[None]  # (1, 3, T, H, W)
        truth = torch.from_numpy(np.stack(truth))
        found = metrics.FirstFrameColourSegmenter()(video, video[:, :, 0], truth[None, 0])[0]
        inter = (found & truth).flatten(1).sum(1).float()
        union = (found | truth).flatten(1).sum(1).float()
        ious.append(inter / union)
    assert torch.cat(ious).min() > 0.8, torch.stack(ious)


def test_masked_lpips_is_zero_for_a_perfect_prediction_and_larger_on_moving_pixels():
    real = square_video(real_offsets())
    copy = real[:, :, :1].expand_as(real).clone()
    moving = metrics.motion_mask(real)
    lpips = metrics.LPIPS()
    assert lpips(real, real, mask=moving) == pytest.approx(0.0, abs=1e-9)
    assert lpips(copy, real, mask=moving) > lpips(copy, real) > 0.0
    with pytest.raises(ValueError, match="does not fit"):
        metrics.masked_psnr(copy, real, moving[:, 1:])


def test_baselines_copy_and_extrapolate_only_the_context_frames():
    real = square_video(real_offsets())
    rows = baseline_predictions(real, 2)
    first, last, linear = rows.values()
    assert list(rows) == [
        "baseline: copy first frame",
        "baseline: copy last context frame (frame 1)",
        "baseline: linear extrapolation of frames 0, 1",
    ]
    for pred in rows.values():  # the context frames are given, the rest is predicted
        assert pred.shape == real.shape and torch.equal(pred[:, :, :2], real[:, :, :2])
    assert all(torch.equal(first[:, :, t], real[:, :, 0]) for t in range(2, FRAMES))
    assert all(torch.equal(last[:, :, t], real[:, :, 1]) for t in range(2, FRAMES))
    # a video whose pixels change linearly in time is extrapolated exactly (and clamped)
    ramp = torch.linspace(-0.9, 0.3, FRAMES).view(1, 1, FRAMES, 1, 1).expand(2, 3, -1, 4, 4)
    exact = baseline_predictions(ramp, 2)["baseline: linear extrapolation of frames 0, 1"]
    torch.testing.assert_close(exact, ramp)
    assert metrics.psnr(exact[:, :, 2:], ramp[:, :, 2:]) == metrics.MAX_PSNR
    steep = torch.linspace(-1, 1, FRAMES).view(1, 1, FRAMES, 1, 1).expand(1, 3, -1, 2, 2)
    far = baseline_predictions(steep[:, :, [0, 2, 4, 4, 4]], 2)
    assert far["baseline: linear extrapolation of frames 0, 1"].max() == 1.0
    # one context frame: only the copy of the first frame
    assert list(baseline_predictions(real, 1)) == ["baseline: copy first frame"]
    with pytest.raises(ValueError, match="nothing to predict"):
        baseline_predictions(real, FRAMES)


def test_the_scorer_scores_only_the_frames_after_the_context():
    real = square_video(real_offsets())
    rows = baseline_predictions(real, 2)
    scorer = Scorer(motion_threshold=metrics.MOTION_THRESHOLD)
    copy_first = scorer(rows["baseline: copy first frame"], real, first_mask(), start=2)
    copy_last = scorer(rows["baseline: copy last context frame (frame 1)"], real, first_mask(), 2)
    # copying a later frame is closer on the moving pixels and in position: the square moved on
    assert copy_last["psnr_moving"] > copy_first["psnr_moving"]
    mean_t = np.mean(np.arange(2, FRAMES))
    assert copy_first["centroid_px"] == pytest.approx(SPEED * mean_t, abs=1e-5)
    assert copy_last["centroid_px"] == pytest.approx(SPEED * (mean_t - 1), abs=1e-5)
    # the perfect prediction is perfect on every column; frame 0 / 1 errors are not scored
    spoiled = real.clone()
    spoiled[:, :, :2] = -1.0
    perfect = scorer(spoiled, real, first_mask(), start=2)
    assert perfect["psnr"] == perfect["psnr_moving"] == metrics.MAX_PSNR
    assert perfect["centroid_px"] == pytest.approx(0.0, abs=1e-6)


def with_gains(video: torch.Tensor, gains: list[float]) -> torch.Tensor:
    """(N, 3, T, H, W) in [-1, 1] with frame t's colours multiplied by gains[t] (a camera gain)."""
    x = (video + 1) / 2 * torch.tensor(gains).view(1, 1, -1, 1, 1)
    return x.clamp(0, 1) * 2 - 1


def bright(video: torch.Tensor) -> torch.Tensor:
    """The video's colours squeezed into the bright range [0.75, 0.95]."""
    return ((video + 1) / 2 * 0.2 + 0.75) * 2 - 1


def test_a_camera_gain_change_alone_moves_no_pixel():
    still = bright(square_video([real_offsets()[0]] * FRAMES))
    gained = with_gains(still, [1.0, 1.06, 0.94, 1.0, 1.04])
    # raw colour differences: a 6 % gain moves every bright pixel by about 0.05
    assert metrics.motion_mask(gained, 0.04, compensate_gain=False)[:, 1:3].all()
    assert not metrics.motion_mask(gained, 0.04).any()  # the gain taken out: nothing moves
    assert metrics.frame_gains(gained)[0].tolist() == pytest.approx([1.0, 1.06, 0.94, 1.0, 1.04])
    # the moving square under the same gains: exactly the pixels it moves over
    moving = bright(square_video(real_offsets()))
    assert torch.equal(
        metrics.motion_mask(with_gains(moving, [1.0, 1.06, 0.94, 1.0, 1.04]), 0.04),
        metrics.motion_mask(moving, 0.04),
    )


def noisy_still_video(n: int = 4, seed: int = 0) -> torch.Tensor:
    """(n, 3, FRAMES, H, W): a static bright scene under the real stream's camera noise."""
    rng = np.random.default_rng(seed)
    scene = ((bright(square_video([real_offsets()[0]] * FRAMES, n)) + 1) * 127.5).round()
    frames = scene.permute(0, 2, 3, 4, 1).numpy().astype(np.uint8)  # (n, T, H, W, 3)
    noisy = np.stack([add_camera_noise(v, rng) for v in frames])
    return torch.from_numpy(noisy).float().permute(0, 4, 1, 2, 3) / 127.5 - 1


def test_the_measured_threshold_follows_the_camera_noise_and_ignores_its_gain():
    video = noisy_still_video()
    noise = metrics.measure_noise(video)
    # add_camera_noise: 4/255 per pixel and frame, so the difference of two frames has sqrt(2) x
    assert noise["sigma"] == pytest.approx(4 / 255 * math.sqrt(2), rel=0.15)
    assert noise["gain_jitter"] == pytest.approx(0.02 * math.sqrt(2), rel=0.5)
    assert noise["threshold"] == metrics.NOISE_SIGMAS * noise["sigma"]
    # nothing moves: the measured, gain-compensated mask marks (almost) nothing
    assert metrics.motion_mask(video, noise["threshold"]).float().mean() < 1e-3


def test_static_changed_counts_the_motion_a_prediction_invents():
    real = square_video(real_offsets())
    moving = metrics.motion_mask(real)
    copy = real[:, :, :1].expand_as(real).clone()
    assert metrics.static_changed(copy, real, moving, metrics.MOTION_THRESHOLD) == 0.0
    assert metrics.static_changed(real.clone(), real, moving, metrics.MOTION_THRESHOLD) == 0.0
    # a second square where nothing moves, from frame 1 on: its 36 pixels per frame are invented
    invented = real.clone()
    invented[:, :, 1:, 24:30, 20:26] = 1.0
    static = (~moving[:, 1:]).sum().item()
    expected = 2 * (FRAMES - 1) * SQUARE * SQUARE / static
    got = metrics.static_changed(invented, real, moving, metrics.MOTION_THRESHOLD)
    assert got == pytest.approx(expected)
    # the scorer: the invented square costs static PSNR and static share, not moving PSNR
    scorer = Scorer(motion_threshold=metrics.MOTION_THRESHOLD)
    clean, spoiled = scorer(real.clone(), real, first_mask()), scorer(invented, real, first_mask())
    assert spoiled["psnr_moving"] == clean["psnr_moving"] == metrics.MAX_PSNR
    assert spoiled["psnr_static"] < 30.0 < clean["psnr_static"]
    assert spoiled["static_changed"] == pytest.approx(expected)
    with pytest.raises(RuntimeError, match="no motion threshold"):
        Scorer()(real, real, first_mask())
