"""The training room: the reference model and trainer, atomic checkpoints, the resume check.

* `model`: the reference captioning model.
* `train`: the trainer (``energon-platform train``, torchrun-ready).
* `checkpoint`: atomic, checksummed checkpoints.
* `preflight`: the checks a run makes before its first step.
* `collector`: the trainer process's garbage collector, paused while it sets up, then frozen.
* `resume_check`: ``energon-platform check-resume`` (our trainer,
  or any command).
* [`step_log_writer`][energon_platform.training.step_log_writer] / `step_log_readers`: a
  JSON-lines step log any loop can write, and readers for it, Megatron-LM's and torchtitan's logs.
"""

from storage.lazy_exports import lazy_exports

#: exported name -> module that defines it (imported on first use)
_NAMES = {
    "checkpoint": "energon_platform.training.checkpoint",
    "preflight": "energon_platform.training.preflight",
    "train": "energon_platform.training.train",
    "CheckpointError": "energon_platform.training.checkpoint",
    "CaptionModel": "energon_platform.training.model",
    "StepLog": "energon_platform.training.step_log_writer",
    "batch_digest": "energon_platform.training.step_log_writer",
    "get_format": "energon_platform.training.step_log_readers",
    "read_steps": "energon_platform.training.step_log_readers",
    "RunSpec": "energon_platform.training.resume_check",
    "check_resume": "energon_platform.training.resume_check",
    "CommandSpec": "energon_platform.training.resume_check",
    "check_resume_cmd": "energon_platform.training.resume_check",
    "RunFailed": "energon_platform.training.resume_check",
    "verdict": "energon_platform.training.resume_check",
}

__all__ = sorted(_NAMES)
__getattr__, __dir__ = lazy_exports(__name__, _NAMES)
