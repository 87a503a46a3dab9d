"""Energon task encoders: decoded samples → training batches, one class per modality.

Modules (each with one job; contracts in their docstrings):

* ``seeding``: per-sample seeds from (run seed, sample key, epoch); ``sample_key``, ``sample_epoch``.
* ``config_parser``: YAML → validated dataclasses, ``ConfigError`` naming file, key and
  expectation; ``config``: the sections every encoder config shares (``EncoderConfig``).
* ``tokenization``: text → ``[BOS, ..., EOS]`` through any local Hugging Face tokenizer.
* ``sequences``: packing choice (first-fit decreasing), row layout, ``cu_seqlens``, collation.
* ``skipping``: ``SkipPolicy``, Energon's error handler with limits for bad samples.
* ``base``: ``SeededTaskEncoder``; ``documents``: ``DocumentTaskEncoder`` and ``TextBatch``.
* ``text``, ``image_text`` (+ ``image_transforms``; its vision-language mode: ``vision_language``),
  ``audio_text`` (+ ``audio_features``): the encoders.
* ``registry``: name → encoder class, ``get_encoder(name | YAML path | dict | config)``.
* ``examples``: a worked new modality. (``preview``, a tool on the loader and the encoders, lives in
  ``energon_platform.tools.preview``: this package never imports ``energon_platform``.)

The names below are imported on first use (`storage.lazy_exports`), so ``import
task_encoders.config`` stays light.
"""

from storage.lazy_exports import lazy_exports

#: exported name -> module that defines it (imported on first use)
_NAMES = {
    "get_encoder": "task_encoders.registry",
    "available": "task_encoders.registry",
    "register": "task_encoders.registry",
    "ConfigError": "task_encoders.config_parser",
    "EncoderConfig": "task_encoders.config",
    "SkipPolicy": "task_encoders.skipping",
    "sample_key": "task_encoders.seeding",
    "sample_epoch": "task_encoders.seeding",
}

__all__ = sorted(_NAMES)  # pyright: ignore[reportUnsupportedDunderAll]  (lazy exports)
__getattr__, __dir__ = lazy_exports(__name__, _NAMES)
