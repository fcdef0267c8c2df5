"""simdist_planner."""
