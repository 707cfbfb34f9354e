"""Faust commands: ``faust -A app <command>``."""
