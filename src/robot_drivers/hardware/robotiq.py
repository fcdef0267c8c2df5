"""Robotiq 2F-85 through the Robotiq URCap's ASCII socket on the UR controller (port 63352).

Commands are lines such as `SET POS 255` (answered `ack`) and `GET POS` (answered `POS 123`);
position 0 is open, 255 closed, as in the MuJoCo gripper's control range.
"""

from __future__ import annotations

import socket
import threading

URCAP_PORT = 63352


class RobotiqGripper:
    def __init__(self, sock: socket.socket, speed: int = 255, force: int = 150):
        self._sock = sock
        self._lock = threading.Lock()
        self._buf = b""
        self._set("ACT", 1)
        self._set("GTO", 1)
        self._set("SPE", speed)
        self._set("FOR", force)

    @classmethod
    def connect(cls, host: str, port: int = URCAP_PORT, timeout_s: float = 2.0) -> "RobotiqGripper":
        try:
            sock = socket.create_connection((host, port), timeout=timeout_s)
        except OSError as e:
            raise ConnectionError(
                f"Robotiq gripper at {host}:{port}: {e}. Is the Robotiq URCap installed and "
                "the gripper activated on the pendant? (set parameter gripper:=false to run "
                "without it)"
            ) from e
        return cls(sock)

    def _line(self) -> str:
        while b"\n" not in self._buf:
            chunk = self._sock.recv(1024)
            if not chunk:
                raise ConnectionError("Robotiq gripper closed the connection")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line.decode().strip()

    def _set(self, var: str, value: int) -> None:
        with self._lock:
            self._sock.sendall(f"SET {var} {int(value)}\n".encode())
            reply = self._line()
        if reply != "ack":
            raise RuntimeError(f"Robotiq gripper refused SET {var} {value}: {reply!r}")

    def move(self, position: int) -> None:
        if not 0 <= int(position) <= 255:
            raise ValueError(f"gripper position must be in 0..255, got {position}")
        self._set("POS", position)

    def position(self) -> int:
        with self._lock:
            self._sock.sendall(b"GET POS\n")
            reply = self._line()
        name, _, value = reply.partition(" ")
        if name != "POS" or not value.strip().isdigit():
            raise RuntimeError(f"unexpected Robotiq reply to GET POS: {reply!r}")
        return int(value)

    def close(self) -> None:
        self._sock.close()
