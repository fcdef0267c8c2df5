"""`simdist launch <graph> name:=value ...`: the pip-installable stand-in for `ros2 launch`.

Starts the node set of `launch_description.resolve()` as subprocesses with the same parameter
files, overrides and remappings the launch_ros files use, prefixes their output with the node
name, supervises them, forwards Ctrl-C (SIGINT to every node, then SIGTERM, SIGABRT and SIGKILL) and
exits non-zero when a node dies. A node that exits 0 on its own (e.g. the MuJoCo driver after
`episodes:=N`) ends the graph cleanly.
"""

from __future__ import annotations

import os
import pathlib
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from simdist_planner.ros import launch_description as desc


@dataclass(frozen=True)
class Escalation:
    """How long each node gets after SIGINT, then after SIGTERM, then after SIGABRT (which
    prints the Python stack of every thread of a node that is still running: nodes run with
    PYTHONFAULTHANDLER=1), before it is killed."""

    sigint_timeout_s: float = 10.0
    sigterm_timeout_s: float = 5.0
    sigabrt_timeout_s: float = 3.0


def executable_path(executable: str) -> str:
    """The console script next to this interpreter (the venv's bin/), else the one on PATH."""
    local = pathlib.Path(sys.executable).parent / executable
    if local.is_file():
        return str(local)

    found = shutil.which(executable)
    if found is None:
        raise FileNotFoundError(
            f"executable {executable!r} not found next to {sys.executable} or on PATH; "
            "install the package (pip install -e . or colcon build)"
        )
    return found


def command_line(node: desc.ResolvedNode) -> list[str]:
    return [executable_path(node.executable), *desc.ros_args(node)]


def parse_launch_args(items: list[str]) -> dict[str, str]:
    """`name:=value` items, as `ros2 launch` takes them."""
    out = {}
    for item in items:
        name, sep, value = item.partition(":=")
        if not sep or not name:
            raise ValueError(f"launch argument {item!r} must look like name:=value")
        out[name] = value
    return out


class Supervisor:
    """Runs a resolved graph's nodes and stops them all together."""

    def __init__(self, graph: desc.ResolvedGraph, escalation: Escalation = Escalation(), log=None):
        self.graph = graph
        self.escalation = escalation
        self.log = log or (lambda msg: print(f"[simdist] {msg}", file=sys.stderr, flush=True))
        self.procs: dict[str, subprocess.Popen] = {}
        self._commands: dict[str, tuple[desc.ResolvedNode, list[str]]] = {}
        self._env: dict[str, str] = {}
        self._stop = threading.Event()
        self._pumps: list[threading.Thread] = []

    def request_stop(self, *_):
        """Signal handler: stop the graph (SIGINT/SIGTERM to the launcher)."""
        self._stop.set()

    def start(self) -> None:
        # faulthandler: a node that ignores SIGINT and SIGTERM shows where it hangs on SIGABRT
        self._env = {**desc.launch_env(self.graph), "PYTHONFAULTHANDLER": "1"}
        self._commands = {
            node.name: (node, command_line(node)) for node in self.graph.nodes
        }  # all found before any starts
        for name in self._commands:
            self._start(name)

    def _start(self, name: str) -> None:
        node, cmd = self._commands[name]
        self.log(f"starting {name}: {shlex.join(cmd)}")
        # own session: a terminal Ctrl-C reaches only the launcher, which forwards it in order
        proc = subprocess.Popen(
            cmd,
            env=self._env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs[name] = proc
        self.log(f"started {name} (pid {proc.pid})")
        pump = threading.Thread(target=self._pump, args=(name, proc), daemon=True)
        pump.start()
        self._pumps.append(pump)

    @staticmethod
    def _pump(name: str, proc: subprocess.Popen) -> None:
        if proc.stdout is None:  # started without a pipe: nothing to forward
            return
        for line in iter(proc.stdout.readline, b""):
            sys.stdout.write(f"[{name}] {line.decode(errors='replace')}")
            sys.stdout.flush()

    def wait(self, poll_s: float = 0.05) -> int:
        """Block until Ctrl-C or a node exits; stop everything; 0 = clean, 1 = a node died.

        A node marked `respawn` (the recorder) that exits is started again after
        RESPAWN_DELAY_S instead, as launch_ros does; the rest of the graph keeps running."""
        code = 0
        respawn_at: dict[str, float] = {}
        while not self._stop.is_set():
            ended = [
                (n, p.returncode)
                for n, p in self.procs.items()
                if n not in respawn_at and p.poll() is not None
            ]
            stop = False
            for name, rc in ended:
                if self._commands[name][0].respawn:
                    self.log(
                        f"node {name} exited with code {rc}; respawning it in "
                        f"{desc.RESPAWN_DELAY_S} s"
                    )
                    respawn_at[name] = time.monotonic() + desc.RESPAWN_DELAY_S
                elif rc == 0:
                    self.log(f"node {name} finished (exit 0); stopping the graph")
                    stop = True
                else:
                    self.log(f"node {name} died with exit code {rc}; stopping the graph")
                    code, stop = 1, True
            if stop:
                break
            for name, at in list(respawn_at.items()):
                if time.monotonic() >= at:
                    del respawn_at[name]
                    self._start(name)
            time.sleep(poll_s)
        else:
            self.log("stop requested; forwarding SIGINT to every node")
        self.shutdown()
        return code

    def shutdown(self) -> None:
        """SIGINT to every live node, then SIGTERM, SIGABRT (a stack dump) and SIGKILL to the
        ones still running."""
        for sig, timeout in (
            (signal.SIGINT, self.escalation.sigint_timeout_s),
            (signal.SIGTERM, self.escalation.sigterm_timeout_s),
            (signal.SIGABRT, self.escalation.sigabrt_timeout_s),
            (signal.SIGKILL, 5.0),
        ):
            alive = {n: p for n, p in self.procs.items() if p.poll() is None}
            if not alive:
                break
            if sig != signal.SIGINT:
                self.log(f"escalating to {sig.name} for {sorted(alive)}")
            for proc in alive.values():
                _signal_group(proc, sig)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and any(p.poll() is None for p in alive.values()):
                time.sleep(0.05)
        for pump in self._pumps:
            pump.join(timeout=1.0)


def _signal_group(proc: subprocess.Popen, sig: signal.Signals) -> None:
    """Signal the node's process group (it may have forked workers)."""
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def launch(graph_name: str, given: dict[str, str], dry_run: bool = False) -> int:
    graph = desc.resolve(graph_name, given)
    if dry_run:
        for key, value in graph.env.items():
            print(f"export {key}={shlex.quote(value)}")
        for node in graph.nodes:
            print(shlex.join(command_line(node)))
        return 0
    supervisor = Supervisor(graph)
    signal.signal(signal.SIGINT, supervisor.request_stop)
    signal.signal(signal.SIGTERM, supervisor.request_stop)
    supervisor.start()
    return supervisor.wait()
