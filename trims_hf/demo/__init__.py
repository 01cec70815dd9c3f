"""``trims demo``: the whole TRIMS chain on an embedded task, offline on a CPU (see :mod:`.pipeline`)."""

from .pipeline import DemoSettings, DemoStudy, run_demo, settings_for

__all__ = ["DemoSettings", "DemoStudy", "run_demo", "settings_for"]
