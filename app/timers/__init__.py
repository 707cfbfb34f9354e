"""Timers: periodic work, each guarded by a database lease (one worker at a time)."""
