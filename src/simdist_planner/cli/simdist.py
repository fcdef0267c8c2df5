"""`simdist launch <graph> name:=value ...`: the pip-installable stand-in for `ros2 launch`.

Starts the node set of `launch_description.resolve()` as subprocesses with the same parameter
files, overrides and remappings the launch_ros files use, prefixes their output with the node
name, supervises them, forwards Ctrl-C (SIGINT to every node, then SIGTERM, SIGABRT and SIGKILL) and
exits non-zero when a node dies, except a node marked respawn (the recorder), which is started
again. A node that exits 0 on its own (e.g. the MuJoCo driver after `episodes:=N`) ends the
graph cleanly.
"""

from __future__ import annotations

import argparse
import sys

from simdist_planner.ros import launch_description as desc
from simdist_planner.ros.launcher import launch, parse_launch_args


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="simdist", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_launch = sub.add_parser(
        "launch", help="start a graph: simdist launch peg robot:=sim checkpoint:=DIR"
    )
    p_launch.add_argument("graph", choices=sorted(desc.GRAPHS))
    p_launch.add_argument("args", nargs="*", help="launch arguments name:=value")
    p_launch.add_argument(
        "--dry-run", action="store_true", help="print the node command lines and exit"
    )
    p_args = sub.add_parser("args", help="list a graph's launch arguments")
    p_args.add_argument("graph", choices=sorted(desc.GRAPHS))
    ns = parser.parse_args(argv)
    if ns.cmd == "args":
        for a in desc.graph_args(ns.graph):
            choices = f" {{{'|'.join(a.choices)}}}" if a.choices else ""
            print(f"{a.name}:={a.default!r}{choices}  {a.description}")
        return 0
    try:
        return launch(ns.graph, parse_launch_args(ns.args), ns.dry_run)
    except (ValueError, FileNotFoundError) as exc:
        print(f"simdist launch: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
