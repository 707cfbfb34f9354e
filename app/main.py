"""The composition root: the Faust app, its topics, agents and web views.

Nothing here decides anything about events; it wires the pieces together.
"""

from __future__ import annotations

import logging

from app.faust_app import create_app, order_event_topic
from app.settings import get_settings

settings = get_settings()
app = create_app(settings)
order_events = order_event_topic(app, settings)

logging.getLogger("app").setLevel(settings.log_level.upper())

# Agents and views register themselves on import. (``import app.web.views``
# would rebind the name ``app`` to the package, hence the ``from`` form.)
from agents import order_events as _order_events_agent  # noqa: E402,F401
from app.web import views as _views  # noqa: E402,F401
