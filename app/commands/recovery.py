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

import click
import faust
from faust.cli import argument, option

from app.adapters.kafka.connection import KafkaConnection
from app.adapters.kafka.watermark import WatermarkTopic
from app.bootstrap import Runtime
from app.commands import database_explained
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


def register(app: faust.App, runtime: Runtime, settings: Settings) -> None:
    @app.command(
        argument("action", type=click.Choice(["start", "status", "end"])),
        option("--hours", type=float, help="start: how long the window lasts (required)"),
        option("--note", help="start/end: why, for the audit trail (required)"),
        option("--actor", default=os.environ.get("USER", "cli"), help="who acts (default: $USER)"),
    )
    async def recovery(self, action: str, hours: float | None, note: str | None, actor: str) -> None:
        """Open, show or end the recovery window (after a failover or a restore from backup)."""
        if action != "status" and not (note or "").strip():
            raise SystemExit(f"recovery {action} needs --note: why, for the audit trail")
        if action == "start" and hours is None:
            raise SystemExit("recovery start needs --hours: how long the window lasts")
        if not ACTOR.fullmatch(actor or ""):
            raise SystemExit("--actor must be 1-64 letters, digits or _.@+-")
        async with database_explained(settings):
            rt = await runtime.start(kafka=False)
            try:
                windows = rt.recovery
                if action == "start":
                    try:
                        opened = await windows.start(hours=hours, actor=f"cli:{actor}", note=note.strip())
                    except ValueError as exc:
                        raise SystemExit(str(exc)) from None
                    self.say(json.dumps({"opened": opened.as_dict()}, default=json_default, indent=2))
                elif action == "end":
                    ended = await windows.end(actor=f"cli:{actor}", note=note.strip())
                    self.say(json.dumps({"ended": [w.as_dict() for w in ended]}, default=json_default, indent=2))
                    if not ended:
                        raise SystemExit("no recovery window was open")
                else:
                    recent = await windows.recent(20)
                    server, watermark = await windows.server() or (None, None)
                    status = {"open": any(w.open for w in recent), "server": server,
                              "watermark": {"store": watermark, "kafka": await kafka_remembers(settings)},
                              "windows": [w.as_dict() for w in recent]}
                    self.say(json.dumps(status, default=json_default, indent=2))
            finally:
                await rt.stop()

    return recovery
