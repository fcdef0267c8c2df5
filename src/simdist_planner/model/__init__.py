"""The world model: typed configs, encoders, transformer dynamics, reward / value / policy heads, scaler, losses and checkpoint I/O. Imports nothing above it."""
