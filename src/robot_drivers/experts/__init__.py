"""Experts: privileged scripted UR5e experts (and their ladder / V^e) and TorchScript policies."""
