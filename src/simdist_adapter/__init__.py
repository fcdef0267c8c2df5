"""simdist_adapter."""
