"""``faust -A app recovery start --hours H | status | end``: the recovery window, from a shell.

While a window is open every worker looks an SMS up by its token before sending it when the
store has no row of it or holds it pending, because the store may have forgotten an earlier
claim, or hold an older state of it (a failover to a replica that lacked the last transactions,
a restore from backup). Each window is kept in ``t_recovery_window`` with who opened and ended it
and why; workers open one by themselves when they find the store on another database server, or
back in time below the watermark Kafka remembers (``app.adapters.mysql.recovery``). ``status``
shows both watermarks.

    faust -A app recovery start --hours 24 --note "restored last night's backup" --actor alice
    faust -A app recovery status
    faust -A app recovery end --note "replayed from offset 0, queue drained" --actor alice
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

import click
import faust
from faust.cli import AppCommand, argument, option

from app.adapters.kafka.connection import KafkaConnection
from app.adapters.kafka.watermark import WatermarkTopic
from app.adapters.mysql.recovery_windows import RecoveryWindows
from app.commands import database_explained
from app.injection import Wire
from app.render import ACTOR, json_default
from app.settings import Settings


async def kafka_remembers(settings: Settings) -> int | str:
    """The highest watermark of this deployment on its watermark topic, or why it cannot be read."""
    topic = WatermarkTopic(KafkaConnection.from_settings(settings.kafka), settings.kafka.store_watermark_topic, settings.app_id, timeout_seconds=5)
    try:
        await asyncio.wait_for(topic.start(), 15)
        return await asyncio.wait_for(topic.read(), 15)
    except Exception as exc:
        return f"not read: {exc or exc.__class__.__name__}"
    finally:
        await topic.stop()


OPTIONS = (
    argument("action", type=click.Choice(["start", "status", "end"])),
    option("--hours", type=float, help="start: how long the window lasts (required)"),
    option("--note", help="start/end: why, for the audit trail (required)"),
    option("--actor", default=os.environ.get("USER", "cli"), help="who acts (default: $USER)"),
)


async def recovery(cmd: AppCommand, action: str, hours: float | None, note: str | None, actor: str, *,
                   settings: Settings, opened: Callable[[], AbstractAsyncContextManager],
                   recovery_windows: RecoveryWindows) -> None:
    """Open, show or end the recovery window (after a failover or a restore from backup)."""
    if action != "status" and not (note or "").strip():
        raise SystemExit(f"recovery {action} needs --note: why, for the audit trail")
    if action == "start" and hours is None:
        raise SystemExit("recovery start needs --hours: how long the window lasts")
    if not ACTOR.fullmatch(actor or ""):
        raise SystemExit("--actor must be 1-64 letters, digits or _.@+-")
    windows = recovery_windows
    async with database_explained(settings), opened():
        if action == "start":
            try:
                opened_window = await windows.start(hours=hours, actor=f"cli:{actor}", note=note.strip())
            except ValueError as exc:
                raise SystemExit(str(exc)) from None
            cmd.say(json.dumps({"opened": opened_window.as_dict()}, default=json_default, indent=2))
        elif action == "end":
            ended = await windows.end(actor=f"cli:{actor}", note=note.strip())
            cmd.say(json.dumps({"ended": [w.as_dict() for w in ended]}, default=json_default, indent=2))
            if not ended:
                raise SystemExit("no recovery window was open")
        else:
            recent = await windows.recent(20)
            server, watermark = await windows.server() or (None, None)
            status = {"open": any(w.open for w in recent), "server": server,
                      "watermark": {"store": watermark, "kafka": await kafka_remembers(settings)},
                      "windows": [w.as_dict() for w in recent]}
            cmd.say(json.dumps(status, default=json_default, indent=2))


def register(app: faust.App, wire: Wire) -> None:
    app.command(*OPTIONS)(wire(recovery))
