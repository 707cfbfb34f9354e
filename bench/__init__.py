"""The throughput benchmark (``python -m bench.run``); see ``bench/run.py`` for what it measures."""
