"""Unitree Go2 in MuJoCo: scene, PD actuation, sensing and the official expert observation."""
