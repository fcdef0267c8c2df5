"""Rotation helpers (rotation vectors <-> matrices) on top of MuJoCo's quaternion routines."""

from __future__ import annotations

import mujoco
import numpy as np


def mat_to_quat(mat: np.ndarray) -> np.ndarray:
    q = np.empty(4)
    mujoco.mju_mat2Quat(q, np.ascontiguousarray(mat, float).reshape(9))
    return q


def rotvec_to_mat(rv: np.ndarray) -> np.ndarray:
    rv = np.asarray(rv, float)
    angle = np.linalg.norm(rv)
    if angle < 1e-12:
        return np.eye(3)
    q = np.empty(4)
    mujoco.mju_axisAngle2Quat(q, rv / angle, angle)
    m = np.empty(9)
    mujoco.mju_quat2Mat(m, q)
    return m.reshape(3, 3)


def mat_to_rotvec(mat: np.ndarray) -> np.ndarray:
    q = mat_to_quat(mat)
    v = np.empty(3)
    mujoco.mju_quat2Vel(v, q, 1.0)
    return v


def rot_error(target: np.ndarray, current: np.ndarray) -> np.ndarray:
    """World-frame rotation vector taking `current` to `target` (target = exp(e) current)."""
    return mat_to_rotvec(target @ current.T)


def yaw_of(mat: np.ndarray) -> float:
    """Heading of a body frame: the angle of its x axis in the world xy plane."""
    return float(np.arctan2(mat[1, 0], mat[0, 0]))


def tcp_yaw(mat: np.ndarray) -> float:
    """Heading of the downward-pointing gripper (TCP) frame: its y axis is the reference, so
    the home orientation has yaw 0."""
    return float(np.arctan2(-mat[0, 0], mat[1, 0]))


def rotz(angle: float) -> np.ndarray:
    c, s = np.cos(angle), np.sin(angle)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


def wrap_angle(a: float, period: float = 2 * np.pi) -> float:
    """Wrap into [-period/2, period/2)."""
    return (a + period / 2) % period - period / 2
