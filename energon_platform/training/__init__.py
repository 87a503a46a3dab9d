"""The training room: the reference model and trainer, atomic checkpoints, the resume check.

* :mod:`~energon_platform.training.model`: the reference captioning model.
* :mod:`~energon_platform.training.train`: the trainer (``energon-platform train``, torchrun-ready).
* :mod:`~energon_platform.training.checkpoint`: atomic, checksummed checkpoints.
* :mod:`~energon_platform.training.resume_check`: ``energon-platform check-resume``.
"""
