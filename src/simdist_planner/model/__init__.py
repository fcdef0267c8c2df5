"""The world model. Imports nothing above it.

Typed configs, encoders, transformer dynamics, reward / value / policy heads, scaler, losses and
checkpoint I/O.
"""
