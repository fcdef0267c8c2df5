"""Observation -> model-input conversion, the history buffer, the Agent and the evaluation table."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from robot_drivers.interface import Observation, ProprioTerm, RobotSpec
from simdist_planner.observation import (
    ObservationError,
    ObservationHistory,
    observation_to_inputs,
)

ARM = RobotSpec(
    name="arm",
    action_dim=3,
    control_rate_hz=5.0,
    proprio_terms=(ProprioTerm("q", 2),),
    cameras=("wrist", "side"),
    image_shape=(4, 6),
    action_low=(-1.0, -1.0, 0.0),
    action_high=(1.0, 1.0, 1.0),
)
DOG = RobotSpec(
    name="dog",
    action_dim=2,
    control_rate_hz=50.0,
    proprio_terms=(ProprioTerm("q", 3),),
    height_map_shape=(3, 2),
    command_dim=3,
    action_low=(-2.0, -2.0),
    action_high=(2.0, 2.0),
)


def arm_obs(k: float = 0.0) -> Observation:
    return Observation(
        stamp=k,
        proprio=np.array([k, -k], np.float32),
        images={
            "side": np.full((4, 6, 3), 200, np.uint8),
            "wrist": np.arange(72, dtype=np.uint8).reshape(4, 6, 3),
        },
    )


def dog_obs(k: float = 0.0) -> Observation:
    return Observation(
        stamp=k,
        proprio=np.array([k, 1.0, 2.0], np.float32),
        height_map=np.full((3, 2), 0.5, np.float32),
        command=np.array([0.3, 0.0, 0.1], np.float32),
    )


def test_images_stack_in_spec_camera_order_as_uint8_chw():
    inputs = observation_to_inputs(arm_obs(1.0), ARM)
    assert set(inputs) == {"proprio", "images"}
    assert inputs["proprio"].shape == (1, 2) and inputs["proprio"].dtype == torch.float32
    images = inputs["images"]
    assert images.shape == (1, 2, 3, 4, 6) and images.dtype == torch.uint8
    wrist = arm_obs().images["wrist"]
    torch.testing.assert_close(images[0, 0], torch.from_numpy(wrist).permute(2, 0, 1))
    assert torch.all(images[0, 1] == 200)


def test_height_map_and_command_keys():
    inputs = observation_to_inputs(dog_obs(), DOG)
    assert set(inputs) == {"proprio", "height_map", "command"}
    assert inputs["height_map"].shape == (1, 3, 2) and inputs["command"].shape == (1, 3)


@pytest.mark.parametrize(
    "spoil, message",
    [
        (lambda o: setattr(o, "proprio", np.array([np.nan, 1.0, 2.0])), "proprio contains NaN"),
        (lambda o: setattr(o, "proprio", np.zeros(4)), r"proprio has shape \(4,\)"),
        (lambda o: setattr(o, "height_map", None), "height_map missing"),
        (lambda o: setattr(o, "command", np.array([np.inf, 0, 0])), "command contains NaN"),
    ],
)
def test_bad_observations_raise(spoil, message):
    obs = dog_obs()
    spoil(obs)
    with pytest.raises(ObservationError, match=message):
        observation_to_inputs(obs, DOG)


def test_missing_or_misshapen_camera_raises():
    obs = arm_obs()
    del obs.images["side"]
    with pytest.raises(ObservationError, match="camera 'side' missing"):
        observation_to_inputs(obs, ARM)
    obs = arm_obs()
    obs.images["side"] = np.zeros((4, 6, 3), np.float32)
    with pytest.raises(ObservationError, match="expected uint8"):
        observation_to_inputs(obs, ARM)


def test_history_repeats_first_observation_then_rolls():
    history = ObservationHistory(DOG, history=3)
    history.reset(dog_obs(0.0))
    proprio, actions = history.tensors()
    assert proprio.shape == (1, 3, 3) and actions.shape == (1, 3, 2)
    assert torch.all(proprio[0, :, 0] == 0.0) and torch.all(actions == 0)
    history.push(dog_obs(0.0), np.array([0.1, 0.2]))
    history.push(dog_obs(1.0), np.array([0.3, 0.4]))
    proprio, actions = history.tensors()
    np.testing.assert_allclose(proprio[0, :, 0], [0.0, 0.0, 1.0])
    np.testing.assert_allclose(actions[0], [[0.0, 0.0], [0.1, 0.2], [0.3, 0.4]], rtol=1e-6)
    with pytest.raises(ObservationError, match="action contains NaN"):
        history.push(dog_obs(2.0), np.array([np.nan, 0.0]))
