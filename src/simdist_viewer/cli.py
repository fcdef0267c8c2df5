"""`simdist-view bag DIR`: recorded episodes (and an adaptation run) in the operator's view.

    simdist-view bag RUN_DIR --rrd view.rrd            # write a recording, open it with `rerun`
    simdist-view bag RUN_DIR --web [--port 9090]       # serve the web viewer until Ctrl-C
                                                       # (on 127.0.0.1; --bind 0.0.0.0 opens it)
    simdist-view bag RUN_DIR --results OUT/results.json --rrd view.rrd   # + adaptation rounds

RUN_DIR is one episode bag or a directory of them (the recorder's `bag_dir`); every bag is
logged, oldest first, with the layout of its graph and on the ROS clock of the run. The live
graph has its own node (`viewer_node`, docs/viewer.md). Errors are one line and exit code 1.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import rerun as rr
from rerun.sinks import LogSinkLike

from robot_drivers import registry
from simdist_adapter.bags import BagError, EpisodeBag
from simdist_viewer import layout as L
from simdist_viewer.bag_view import episode_bags, log_adaptation, log_bags, robot_of
from simdist_viewer.serve import LOCAL_BIND, WebViewerServer, grpc_server


def _graph_of(bag_dir: pathlib.Path, graph: str) -> str:
    if graph:
        return graph
    with EpisodeBag(bag_dir) as bag:
        task, robot = bag.meta.task, robot_of(bag)
    if task in registry.TASKS and registry.robot_of(task) == robot and registry.entry(task).graph:
        return registry.entry(task).graph
    return next(
        registry.entry(t).graph for t in registry.tasks_of(robot) if registry.entry(t).graph
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="simdist-view", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("bag", help="show recorded episode bags (same layout as the live view)")
    b.add_argument("path", help="an episode bag or a run directory of them")
    b.add_argument("--rrd", default="", help="write the recording to this .rrd file")
    b.add_argument("--web", action="store_true", help="serve the web viewer (until Ctrl-C)")
    b.add_argument("--port", type=int, default=9090, help="web viewer port (--web)")
    b.add_argument("--grpc-port", type=int, default=9876, help="gRPC port the web viewer reads")
    b.add_argument(
        "--bind",
        default=LOCAL_BIND,
        help="IP address the servers listen on (--web): 127.0.0.1 this machine only (default), "
        "0.0.0.0 every interface",
    )
    b.add_argument("--graph", default="", help="layout of this graph (default: the bag's task)")
    b.add_argument("--results", default="", help="an adaptation run's results.json to add")
    b.add_argument("--no-3d", action="store_true", help="leave out the robot's MuJoCo bodies")
    b.add_argument("--image-every-n", type=int, default=1, help="log every n-th image")
    b.add_argument(
        "--serve-s", type=float, default=0.0, help="--web: stop after this many s (0: Ctrl-C)"
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if not args.rrd and not args.web:
        print("simdist-view: give --rrd FILE and/or --web", file=sys.stderr)
        return 1
    try:
        bags = episode_bags(args.path)
        graph = _graph_of(bags[0], args.graph)
        bp = L.blueprint(graph, adaptation=bool(args.results))
        rec = rr.RecordingStream(L.APPLICATION_ID, recording_id=f"bags:{args.path}")
        sinks: list[LogSinkLike] = []
        if args.rrd:
            sinks.append(rr.FileSink(args.rrd))
        uri = ""
        if args.web:
            server, uri = grpc_server(args.bind, args.grpc_port)
            sinks.append(server)
        rec.set_sinks(*sinks, default_blueprint=bp)
        report = log_bags(rec, args.path, robot_3d=not args.no_3d, image_every_n=args.image_every_n)
        rounds = log_adaptation(rec, args.results) if args.results else 0
        rec.flush()
    except (BagError, FileNotFoundError, ValueError, OSError, RuntimeError) as exc:
        print(f"simdist-view: {exc}", file=sys.stderr)
        return 1
    print(
        f"{len(report.bags)} bag(s) of {report.robot}, {report.messages} messages, "
        f"{sum(report.counts.values())} rows on {len(report.counts)} entities"
        + (f", {rounds} adaptation rounds" if args.results else "")
        + (f" -> {args.rrd}" if args.rrd else ""),
        flush=True,
    )
    if uri:
        try:
            web = WebViewerServer(args.bind, args.port, uri)
        except RuntimeError as exc:
            print(f"simdist-view: {exc}", file=sys.stderr)
            rec.disconnect()
            return 1
        print(f"web viewer: {web.url}", flush=True)
        end = time.monotonic() + args.serve_s if args.serve_s > 0 else float("inf")
        try:
            while time.monotonic() < end:
                time.sleep(0.2)
        except KeyboardInterrupt:
            pass
        finally:
            web.close()
    rec.disconnect()
    return 0


if __name__ == "__main__":
    sys.exit(main())
