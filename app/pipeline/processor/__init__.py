"""The three transactions of the idempotent-step pipeline, for a list of events: T1 claims and
applies (``claim``), T2 calls out (``calls``), T3 records (``record``); ``run`` holds the processor
that runs them, with the timeline of their crash windows."""

from app.pipeline.processor.policy import ProcessorPolicy, Safeguards
from app.pipeline.processor.run import Processor
from app.pipeline.processor.state import Guard, Result, Settled

__all__ = ["Guard", "Processor", "ProcessorPolicy", "Result", "Safeguards", "Settled"]
