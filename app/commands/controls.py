"""``faust -A app hold ...`` and ``faust -A app pause ...``: the operator controls from a shell
(``app.pipeline.controls``). Every change is audited (``t_control_audit``) as ``cli:<actor>``.

    faust -A app hold start --effect sms --end 2026-12-08T03:00:00+08:00 --reason "gateway maintenance" \\
                            [--start 2026-12-08T02:00:00+08:00] [--until-released]
    faust -A app hold start --effect waybill --hours 2 --until-released --reason "courier account migration"
    faust -A app hold end --effect sms --note "the gateway is back"        (or --id N)
    faust -A app hold list
    faust -A app pause start --partition 3 --reason "a poisoned stretch upstream"
    faust -A app pause end --partition 3 --note "the stretch was skipped upstream"
    faust -A app pause list

A hold with ``--until-released`` lasts until a person ends it, its end being when they expect to
(``EffectHoldOverdue`` alerts past it); without, it ends by itself at its end.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime

import click
import faust
from faust.cli import AppCommand, argument, option

from app.adapters.mysql.controls import ControlRefused, MySqlControls
from app.commands import database_explained
from app.injection import Wire
from app.pipeline.controls import hold_window
from app.render import ACTOR, json_default
from app.settings import Settings

HOLD_OPTIONS = (
    argument("action", type=click.Choice(["start", "end", "list"])),
    option("--effect", help="start/end: the effect held (end: every hold of it)"),
    option("--id", "hold_id", type=int, help="end: the hold to end"),
    option("--start", help="start: when it begins, ISO 8601 with a zone (default: now)"),
    option("--end", help="start: its planned end, ISO 8601 with a zone"),
    option("--hours", type=float, help="start: how long it lasts, instead of --end"),
    option("--until-released", is_flag=True, help="start: it lasts until a person ends it (alerts past its end)"),
    option("--reason", help="start: why, for the people who will see it (required)"),
    option("--note", help="end: what changed (required)"),
    option("--actor", default=os.environ.get("USER", "cli"), help="who acts (default: $USER)"),
)
PAUSE_OPTIONS = (
    argument("action", type=click.Choice(["start", "end", "list"])),
    option("--partition", type=int, help="start/end: the partition of the input"),
    option("--topic", help="start/end: the topic (default: ORDER_EVENT_TOPIC)"),
    option("--reason", help="start: why (required)"),
    option("--note", help="end: what was found (required)"),
    option("--actor", default=os.environ.get("USER", "cli"), help="who acts (default: $USER)"),
)


def when(value: str | None, name: str) -> datetime | None:
    if value is None:
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise SystemExit(f"{name} must be an ISO 8601 time with its zone, like 2026-12-08T02:00:00+08:00") from None
    if moment.tzinfo is None:
        raise SystemExit(f"{name} must say its zone (+08:00, Z): {value!r} could be any of them")
    return moment


def checked_actor(actor: str) -> str:
    if not ACTOR.fullmatch(actor or ""):
        raise SystemExit("--actor must be 1-64 letters, digits or _.@+-")
    return f"cli:{actor}"


async def hold(cmd: AppCommand, action: str, effect: str | None, hold_id: int | None, start: str | None,
               end: str | None, hours: float | None, until_released: bool, reason: str | None, note: str | None,
               actor: str, *, settings: Settings, opened: Callable[[], AbstractAsyncContextManager],
               operator_controls: MySqlControls, effect_names: tuple[str, ...]) -> None:
    """Hold an effect across the whole group (its records wait, nothing is dead-lettered), end a hold, or list them."""
    if effect is not None and effect not in effect_names:
        raise SystemExit(f"--effect must be one of {', '.join(effect_names)}")
    async with database_explained(settings), opened():
        try:
            if action == "start":
                if effect is None:
                    raise SystemExit("hold start needs --effect")
                begins, lasts = hold_window(datetime.now(UTC), start=when(start, "--start"), end=when(end, "--end"),
                                            hours=hours)
                made = await operator_controls.hold(effect, reason=reason or "", actor=checked_actor(actor),
                                                    starts_in=begins, lasts=lasts, auto_release=not until_released)
                cmd.say(json.dumps({"held": made.as_dict()}, default=json_default, indent=2))
            elif action == "end":
                ended = await operator_controls.release(actor=checked_actor(actor), note=note or "", hold_id=hold_id,
                                                        effect=effect)
                cmd.say(json.dumps({"ended": [h.as_dict() for h in ended]}, default=json_default, indent=2))
                if not ended:
                    raise SystemExit("no such hold in force")
            else:
                holds, _ = await operator_controls.in_force()
                ended = [e for e in await operator_controls.ended(20) if e.kind == "hold"]
                cmd.say(json.dumps({"holds": [h.as_dict() for h in holds], "ended": [e.as_dict() for e in ended]},
                                   default=json_default, indent=2))
        except (ControlRefused, ValueError) as exc:
            raise SystemExit(str(exc)) from None


async def pause(cmd: AppCommand, action: str, partition: int | None, topic: str | None, reason: str | None,
                note: str | None, actor: str, *, settings: Settings,
                opened: Callable[[], AbstractAsyncContextManager], operator_controls: MySqlControls) -> None:
    """Pause one partition of the input across the whole group, resume it, or list the pauses."""
    topic = topic or settings.kafka.topic
    if action != "list" and (partition is None or not 0 <= partition < settings.kafka.partitions):
        raise SystemExit(f"pause {action} needs --partition, 0 to {settings.kafka.partitions - 1} "
                         f"(ORDER_EVENT_PARTITIONS={settings.kafka.partitions})")
    async with database_explained(settings), opened():
        try:
            if action == "start":
                assert partition is not None
                made, new = await operator_controls.pause(topic, partition, reason=reason or "",
                                                          actor=checked_actor(actor))
                cmd.say(json.dumps({"paused": made.as_dict(), "new": new}, default=json_default, indent=2))
            elif action == "end":
                assert partition is not None
                ended = await operator_controls.resume(topic, partition, actor=checked_actor(actor), note=note or "")
                if ended is None:
                    raise SystemExit(f"{topic}[{partition}] is not paused")
                cmd.say(json.dumps({"resumed": ended.as_dict()}, default=json_default, indent=2))
            else:
                _, pauses = await operator_controls.in_force()
                ended = [e for e in await operator_controls.ended(20) if e.kind == "pause"]
                cmd.say(json.dumps({"pauses": [p.as_dict() for p in pauses], "ended": [e.as_dict() for e in ended]},
                                   default=json_default, indent=2))
        except (ControlRefused, ValueError) as exc:
            raise SystemExit(str(exc)) from None


def register(app: faust.App, wire: Wire) -> None:
    app.command(*HOLD_OPTIONS)(wire(hold))
    app.command(*PAUSE_OPTIONS)(wire(pause))
