"""`simdist-bag recover DIR...`: rebuild episode bags a killed recorder left unfinalised.

Like `ros2 bag reindex`: every complete message of the bag's MCAP goes into a new, finalised
MCAP with its `metadata.yaml`; the original file stays beside it as `<name>.mcap.unfinalised`
(docs/safety.md, "Recovering a bag"). `simdist-bag recover --all ROOT` recovers every
unfinalised bag under ROOT (the recorder's `bag_dir`). Errors are one line each; the exit code
is 1 if any bag could not be recovered.
"""

from __future__ import annotations

import argparse
import sys

from simdist_adapter.bags import BagError, recover_bag, unfinalised_bags


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="simdist-bag", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("recover", help="rebuild unfinalised episode bags")
    p.add_argument("paths", nargs="+", help="bag directories (with --all: bag_dir roots)")
    p.add_argument("--all", action="store_true", help="every unfinalised bag under each path")
    args = parser.parse_args(argv)
    bags = (
        [bag for root in args.paths for bag in unfinalised_bags(root)] if args.all else args.paths
    )
    if not bags:
        print("simdist-bag: no unfinalised bag found")
        return 0
    failed = 0
    for path in bags:
        try:
            r = recover_bag(path)
        except (BagError, OSError) as exc:
            print(f"simdist-bag: {path}: {exc}", file=sys.stderr)
            failed += 1
            continue
        tail = "; the file ended inside a record (lost)" if r.truncated else ""
        print(
            f"recovered {r.path}: {r.messages} messages on {r.topics} topics{tail}; "
            f"original kept as {r.original.name}"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
