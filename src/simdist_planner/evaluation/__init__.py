"""Closed-loop work in simulation: agents, evaluation, dataset generation (Algorithm 2), checkpoint selection, probes, readouts, ablations."""
