"""Evaluation: benchmark tasks (:mod:`.tasks`), ``evaluate`` metrics (:mod:`.metrics`), the lm-evaluation-harness
model (:mod:`.harness`), decoding a task and its records (:mod:`.evaluate`), AUP (:mod:`.aup`), results files and
plots (:mod:`.results`) and the paper's published numbers (:mod:`.published`).

Nothing is imported here, so ``trims eval --help`` reads :mod:`.published` without loading torch."""
