"""The loader room: which samples a position means, and how they become batches.

* `schedule`: the global order of a training stream, a pure
  function of (seed, position); restore is O(1) and layout-free.
* `source`: random access to an Energon dataset split.
* `batches`: positions → samples → task encoder → micro-batches.
* [`state`][energon_platform.loader.state]: the saved state (plain JSON, versioned, fingerprinted).
* [`train_loader`][energon_platform.loader.train_loader]: the ``Stateful`` train loader and the val loader.
"""

from storage.lazy_exports import lazy_exports

#: exported name -> module that defines it (imported on first use)
_NAMES = {
    "TrainLoader": "energon_platform.loader.train_loader",
    "build_val_loader": "energon_platform.loader.val_loader",
    "build_encoder": "energon_platform.loader.run_plan",
    "gradient_accumulation_steps": "energon_platform.loader.layout",
    "check_layout": "energon_platform.loader.layout",
    "LoaderWorkerError": "energon_platform.loader.train_loader",
    "StateMismatchError": "energon_platform.loader.state",
    "LayoutError": "energon_platform.loader.schedule",
    "Schedule": "energon_platform.loader.schedule",
    "SampleSource": "energon_platform.loader.source",
}

__all__ = sorted(_NAMES)
__getattr__, __dir__ = lazy_exports(__name__, _NAMES)
