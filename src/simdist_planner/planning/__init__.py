"""Acting with a world model: the MPPI planner, its per-robot configs, and robot observation -> model inputs."""
