"""Training, the pipeline's second stage: the forward processes (:mod:`.masking`), :class:`.collator.TrimsDataCollator`,
:class:`.config.MDLMConfig`, :class:`.trainer.MDLMTrainer`, LoRA (:mod:`.lora`), decode-and-log callbacks
(:mod:`.callbacks`), the adapter card (:mod:`.model_card`) and ``trims train``'s job (:mod:`.train_job`).

The objective itself (:mod:`trims_hf.students.loss`) and the block-diffusion view (:mod:`trims_hf.students.block_diffusion`)
live with the students: a loaded student computes that loss in its own forward under a plain ``transformers.Trainer``."""
