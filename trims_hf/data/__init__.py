"""Scoring and data, the pipeline's first stage: the teacher's per-token scores (:mod:`.teacher`, :mod:`.scoring`),
the data set columns (:mod:`.schema`), equal-mass buckets (:mod:`.buckets`), Hub loading and cards (:mod:`.hub`),
scored rows to student rows (:mod:`.preparation`), and ``trims score``'s resumable job (:mod:`.score_job`)."""
