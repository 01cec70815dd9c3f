"""Jobs: the library's pieces composed into the runs behind ``trims score`` and ``trims train``, callable from Python."""
