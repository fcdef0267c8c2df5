"""Acting with a world model.

The MPPI planner, its per-robot configs, and robot observation -> model inputs.
"""
