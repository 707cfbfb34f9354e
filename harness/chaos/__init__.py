"""The chaos run (``make chaos``, and the short run ``tests/chaos/test_chaos.py``): the driver, its
storm and workload, and the checker that reads what the run left (``CONTRACT.md``)."""
