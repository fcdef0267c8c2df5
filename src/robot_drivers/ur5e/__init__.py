"""MuJoCo UR5e + Robotiq 2F-85: scene composition, servoL-like controller, backend.

Rendering is headless: MUJOCO_GL defaults to `egl` here (set it to `osmesa` before the first
`import mujoco` to use OSMesa instead).
"""

import os

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("PYOPENGL_PLATFORM", os.environ["MUJOCO_GL"])
