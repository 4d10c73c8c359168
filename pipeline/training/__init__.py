"""Nightly DDP training of the fraud model.

Entry points: ``jobs/train.py`` (one process per rank under torchrun), ``fraudctl train`` and
:func:`pipeline.training.launch.run_training` (launch torchrun, return the summary), and
:func:`pipeline.training.export.export_model_from_checkpoint`. The run directory layout is
documented in run_dir.py; the story of a run in trainer.py.
"""
