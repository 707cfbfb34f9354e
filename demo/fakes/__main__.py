"""``python -m demo.fakes [--host H] [--port P] [--config JSON]``: every fake provider on one port.

``python -m demo.fakes --worker-settings URL`` prints instead what sends a worker's calls to the
fakes at ``URL`` (``NAME=VALUE``, a line each: every effect's URL, whichever provider it picks, and
what that provider's fake needs), but those the environment already sets, under their name or an
older one (``LOGISTICS_URL``): what ``make run`` exports.
"""

from __future__ import annotations

import argparse
import json
import os

from aiohttp import web

from app.settings.effects import ALIASES
from demo.fakes.registry import worker_settings
from demo.fakes.server import FakeServices


def unset_settings(url: str) -> dict[str, str]:
    """The worker settings for the fakes at ``url`` that the environment does not set already."""
    older = {f"EFFECTS__{effect.upper()}__{key.upper()}": name.upper() for (effect, key), name in ALIASES.items()}
    return {name: value for name, value in worker_settings(url).items()
            if not os.environ.get(name) and not os.environ.get(older.get(name, ""))}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m demo.fakes", description="Fake providers: the logistics "
                                     "API, the express courier and the SMS gateway, and any fake the registry lists")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8900)
    parser.add_argument("--config", default="{}", help="initial faults, JSON by fake name (demo/fakes/faults.py)")
    parser.add_argument("--worker-settings", metavar="URL", default=None,
                        help="print the settings that send a worker to the fakes at URL (NAME=VALUE lines), but "
                             "those the environment sets, and exit")
    args = parser.parse_args(argv)
    if args.worker_settings is not None:
        for name, value in unset_settings(args.worker_settings).items():
            print(f"{name}={value}")
        return
    fakes = FakeServices()
    fakes.configure(json.loads(args.config))
    web.run_app(fakes.app(), host=args.host, port=args.port, access_log=None,
                print=lambda _: print(f"fake services on http://{args.host}:{args.port}", flush=True))


if __name__ == "__main__":
    main()
