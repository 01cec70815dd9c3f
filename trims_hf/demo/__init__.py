"""``trims demo``: the whole TRIMS chain on an embedded task, offline on a CPU (see :mod:`.pipeline`)."""

from .pipeline import DemoRun, DemoSettings, run_demo, settings_for

__all__ = ["DemoRun", "DemoSettings", "run_demo", "settings_for"]
