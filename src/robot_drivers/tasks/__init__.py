"""Simulated tasks: a robot backend plus reward, success and resets.

`robot_drivers.registry` names them and pairs each with its expert.
"""
