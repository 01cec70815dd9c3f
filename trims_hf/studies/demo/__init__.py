"""``trims demo``: the whole TRIMS chain on generated word problems, offline on a CPU: its protocol and presets
(:mod:`.presets`, torch-free) and its study (:mod:`.pipeline`)."""
