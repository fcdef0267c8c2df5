"""robot_drivers."""
