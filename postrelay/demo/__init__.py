"""`postrelay demo`: the whole system on embedded defaults (see `run`)."""

from postrelay.demo.run import DemoReport, emit_demo_events, run_demo

__all__ = ["DemoReport", "emit_demo_events", "run_demo"]
