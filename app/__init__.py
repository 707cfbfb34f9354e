"""The order-event processor.

``faust -A app worker`` finds the Faust app as ``app.app``. It is built on
first access, so the pure packages below (``app.pipeline``, ``app.settings``)
import without pulling in Faust.
"""

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "app":
        from app.main import app as faust_app

        return faust_app
    raise AttributeError(f"module 'app' has no attribute {name!r}")
