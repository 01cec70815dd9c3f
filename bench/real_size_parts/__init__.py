"""bench/real_size.py's parts, one module each (train, zero2, score, decode), and what they share (common)."""
