"""The idempotent-step pipeline: event contract, state machines, step
declarations, claim/lease/fencing and the batch strategy.

Imports nothing from Faust or aiohttp: the database, the external services
and the dead-letter topic plug in through ``app.pipeline.ports``. What becomes of a
dead letter once the batch gave it up is ``app.compensation``'s.
"""
