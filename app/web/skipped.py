"""The types this consumer group skipped, over JSON: what its upstreams publish that no step reads.

    GET /skipped/

Per type: how many records were skipped, first and last seen, and where the latest one is (topic,
partition, offset), from ``t_skipped_type``, and whether ``FOREIGN_EVENT_TYPES`` names it (another
team's type, skipped knowingly); with ``UNHANDLED_EVENT_TYPES`` and the types handled, so the page says
what a skip means. Workers add their counts at each gauges' refresh. A type's name is whatever an
upstream wrote: a viewer (``WEB_READ_TOKEN``) reads it masked, like every data view.
"""

from __future__ import annotations

from aiohttp import web

from app.adapters.mysql.reads.console import Queries
from app.adapters.mysql.skipped_types import SkippedTypes
from app.pipeline.envelopes import Reading
from app.pipeline.events import EventType
from app.settings import Settings
from app.web.http import Routes, as_seen, json_response, role


async def skipped(request: web.Request, *, settings: Settings, skipped_types: SkippedTypes, reading: Reading,
                  queries: Queries) -> web.Response:
    foreign = reading.foreign
    types = [{**row, "declared": row["event_type"] in foreign} for row in await skipped_types.list()]
    answer = {"unhandled": settings.events.unhandled, "handled": [t.value for t in EventType],
              "type_names": reading.type_names, "foreign": sorted(foreign),
              "new_skipped_type_seconds": settings.events.new_skipped_type_seconds,
              "refresh_seconds": settings.operations.metrics_refresh_seconds, "types": types}
    return json_response(await as_seen(role(request, settings), answer, queries))


ROUTES: Routes = {"/skipped/": {"get": skipped}}
