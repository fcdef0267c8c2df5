"""The viewer's network servers, on the loopback interface unless asked otherwise.

Two servers show a view: the Rerun gRPC server that holds the recording (native and web viewers
read it) and, for the web viewer, an HTTP server of its HTML and Wasm. Both listen on `bind`,
127.0.0.1 by default, so the robot's camera images and state stay on this machine; `0.0.0.0`
(or `::`) opens them to the network, the node parameter `bind` / the CLI flag `--bind`.

The gRPC server is the SDK's `GrpcServerSink(bind_ip=...)`. The SDK's in-process web server
(`rr.serve_web_viewer`) has no bind address and always listens on every interface, so the web
viewer is the Rerun CLI (`rerun --serve-web --bind ...`, from the same wheel) in a child process
that serves only the viewer, pointed at the gRPC server.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import ipaddress
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import rerun as rr
import rerun_bindings

LOCAL_BIND = "127.0.0.1"
ALL_INTERFACES = ("0.0.0.0", "::")


def check_bind(bind: str) -> str | None:
    """None when `bind` is an IP address a server can listen on, else the reason it is not."""
    try:
        ipaddress.ip_address(bind)
    except ValueError:
        return (
            f"bind must be an IP address (127.0.0.1 local, 0.0.0.0 every interface), got {bind!r}"
        )
    return None


def local_host(bind: str) -> str:
    """The host a client on this machine connects to for a server listening on `bind`."""
    if bind in ALL_INTERFACES:
        return LOCAL_BIND
    return f"[{bind}]" if ":" in bind else bind


def grpc_server(bind: str, port: int) -> tuple[rr.GrpcServerSink, str]:
    """A Rerun gRPC server sink listening on `bind`:`port`, and the URI a viewer here uses."""
    reason = check_bind(bind)
    if reason:
        raise ValueError(reason)
    sink = rr.GrpcServerSink(bind_ip=bind, port=port)
    return sink, f"rerun+http://{local_host(bind)}:{port}/proxy"


def spawn_viewer(bind: str, port: int) -> str:
    """Start a native Rerun viewer whose gRPC server listens on `bind`:`port` (`rr.spawn` has
    no bind address: the CLI flag is passed as its extra argument); returns its URI."""
    reason = check_bind(bind)
    if reason:
        raise ValueError(reason)
    rerun_bindings.spawn(  # the arguments of rerun._spawn._spawn_viewer, and the bind address
        port=port,
        memory_limit="75%",
        server_memory_limit="1GiB",
        hide_welcome_screen=False,
        detach_process=True,
        executable_name="rerun",
        executable_path=None,
        extra_args=["--bind", bind],
        extra_env=[("RERUN_APP_ONLY", "true")],
        headless=False,
    )
    return f"rerun+http://{local_host(bind)}:{port}/proxy"


def rerun_cli_binary() -> str:
    """The Rerun CLI binary of the installed wheel (`python -m rerun_cli` runs it in a child
    of its own, which a signal to the wrapper would not stop); else `rerun` on the PATH."""
    spec = importlib.util.find_spec("rerun_cli")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        exe = pathlib.Path(folder) / ("rerun.exe" if sys.platform.startswith("win") else "rerun")
        if exe.is_file():
            return str(exe)
    return shutil.which("rerun") or "rerun"


def _die_with_parent() -> None:  # runs in the child between fork and exec
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG: the server ends with the viewer


class WebViewerServer:
    """The Rerun web viewer served over HTTP on `bind`:`port`, pointed at the gRPC server
    `connect_to`; a child process, stopped by `close()` (and when this process dies)."""

    def __init__(self, bind: str, port: int, connect_to: str, start_timeout_s: float = 30.0):
        reason = check_bind(bind)
        if reason:
            raise ValueError(reason)
        self.bind, self.port = bind, port
        self.url = f"http://{local_host(bind)}:{port}/?url={connect_to}"
        self._log = tempfile.TemporaryFile()
        cmd = [rerun_cli_binary(), "--serve-web", "--bind", bind]
        cmd += ["--web-viewer-port", str(port), connect_to]
        if self._listening():
            raise RuntimeError(f"web viewer: something already listens on port {port}")
        self._proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
        )
        deadline = time.monotonic() + start_timeout_s
        while not self._listening():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self._stop()
                self._log.seek(0)
                tail = self._log.read()[-2000:].decode(errors="replace")
                self._log.close()
                raise RuntimeError(f"web viewer on {bind}:{port} did not start: {tail.strip()}")
            time.sleep(0.1)

    @property
    def pid(self) -> int:
        """The server process."""
        return self._proc.pid

    def _listening(self) -> bool:
        host = local_host(self.bind).strip("[]")
        try:
            with socket.create_connection((host, self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def close(self) -> None:
        """Stop the server. Idempotent."""
        self._stop()
        self._log.close()

    def _stop(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
