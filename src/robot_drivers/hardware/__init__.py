"""Hardware backends (UR5e via ur_rtde, Go2 via unitree_sdk2py) behind `RobotBackend`.

The vendor clients are imported lazily inside `connect_*` functions, so the translation logic
(units, joint order, CRC, watchdog, stop handling) imports and tests without them.
"""
