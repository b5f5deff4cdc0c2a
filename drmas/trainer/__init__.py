"""The pipeline: the trainer's step and run (:mod:`drmas.trainer.trainer`), the run folder and its checkpoints
(:mod:`~drmas.trainer.run_folder`), the rollout loop (:mod:`~drmas.trainer.collect`), every logged key
(:mod:`~drmas.trainer.metrics`), the health checks (:mod:`~drmas.trainer.health`) and the SFT warm-up of missing
checkpoints (:mod:`~drmas.trainer.warmup`). Nothing is imported here: each module is imported by name."""
