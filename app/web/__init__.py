"""Web views served by each worker (port WEB_PORT)."""
