"""What a worker shows of itself: its Prometheus metrics (``metrics``) and the Faust monitor
that feeds the commit ones (``monitor``)."""
