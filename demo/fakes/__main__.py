"""``python -m demo.fakes [--host H] [--port P] [--config JSON]``: every fake provider on one port."""

from __future__ import annotations

import argparse
import json

from aiohttp import web

from demo.fakes.server import FakeServices


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m demo.fakes", description="Fake providers: the logistics "
                                     "API, the express courier and the SMS gateway, and any fake the registry lists")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8900)
    parser.add_argument("--config", default="{}", help="initial faults, JSON by fake name (demo/fakes/faults.py)")
    args = parser.parse_args(argv)
    fakes = FakeServices()
    fakes.configure(json.loads(args.config))
    web.run_app(fakes.app(), host=args.host, port=args.port, access_log=None,
                print=lambda _: print(f"fake services on http://{args.host}:{args.port}", flush=True))


if __name__ == "__main__":
    main()
