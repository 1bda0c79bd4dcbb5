"""python3 -m shardvisor route (--map-file FILE | --sidecar URL [--batch]) UID...

prints one JSON answer per line, with the fields of `shardctl route --json`."""

from __future__ import annotations

import argparse
import json
import sys
from typing import List

from .routing import MapError, Router
from .sidecar import SidecarClient, SidecarError


def main(argv: List[str]) -> int:
    p = argparse.ArgumentParser(prog="python3 -m shardvisor", description="shardvisor's Python client")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("route", help="route user ids with a map file or the router sidecar")
    src = r.add_mutually_exclusive_group(required=True)
    src.add_argument("--sidecar", help="router sidecar base URL, e.g. http://127.0.0.1:8484")
    src.add_argument("--map-file", help="a map file (SHARDVISOR_MAP_FILE, or a saved GET /v1/map)")
    r.add_argument("--batch", action="store_true", help="with --sidecar: one POST for all user ids")
    r.add_argument("uids", nargs="+")
    args = p.parse_args(argv)
    try:
        if args.map_file:
            rt = Router.from_map_file(args.map_file)
            for uid in args.uids:
                d = rt.route(uid).as_dict()
                del d["key"]
                print(json.dumps(d, ensure_ascii=False))
        elif args.batch:
            for ans in SidecarClient(args.sidecar).route_many(args.uids)["routes"]:
                print(json.dumps(ans, ensure_ascii=False))
        else:
            c = SidecarClient(args.sidecar)
            for uid in args.uids:
                print(json.dumps(c.route(uid), ensure_ascii=False))
    except (SidecarError, MapError, OSError) as e:
        print(f"shardvisor: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
