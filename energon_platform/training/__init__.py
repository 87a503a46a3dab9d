"""The training room: the reference model and trainer, atomic checkpoints, the resume check.

* :mod:`~energon_platform.training.model`: the reference captioning model.
* :mod:`~energon_platform.training.train`: the trainer (``energon-platform train``, torchrun-ready).
* :mod:`~energon_platform.training.checkpoint`: atomic, checksummed checkpoints.
* :mod:`~energon_platform.training.preflight`: the checks a run makes before its first step.
* :mod:`~energon_platform.training.resume_check`: ``energon-platform check-resume`` (our trainer,
  or any command).
* :mod:`~energon_platform.training.step_log_writer` / :mod:`~energon_platform.training.step_log_readers`: a
  JSON-lines step log any loop can write, and readers for it, Megatron-LM's and torchtitan's logs.
"""
