"""Closed-loop work in simulation.

Agents, evaluation, dataset generation (Algorithm 2), checkpoint selection, probes, readouts and
ablations.
"""
