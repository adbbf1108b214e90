"""`postrelay demo`: the whole system on embedded defaults (see `run`)."""

from postrelay.demo.run import DemoReport, run_demo

__all__ = ["DemoReport", "run_demo"]
