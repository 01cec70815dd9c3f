"""The studies' wing: the experiments that test TRIMS, built on the plugin and never imported by it.

- :mod:`.protocol`: a study's pre-registered protocol, its fingerprint and ``FIELD=VALUE`` overrides;
- :mod:`.study`: the resumable study runner ``Study`` (data, pretrained, score, base, models, report);
- :mod:`.units`: its resumable units of work (``Units``: a folder each, finished when its key file says so);
- :mod:`.regime`: the chain-task regime study (curve, seed study, its statistics);
- :mod:`.smollm2`: the pre-registered SmolLM2-135M-Instruct replication (its protocols, stage budgets on an
  H100, the ``Replication`` study and the pre-study);
- :mod:`.demo`: ``trims demo``, the whole chain offline on a CPU;
- :mod:`.tiny`, :mod:`.arith`: the studies' own tiny pretrained models and generated arithmetic word problems;
- :mod:`.annealing`, :mod:`.analysis`, :mod:`.accelerators`: DiffuLLaMA's attention annealing, run analyses, and
  the accelerator peaks the benchmarks compare with.

``tests/test_wings.py`` checks that no plugin module imports this package."""
