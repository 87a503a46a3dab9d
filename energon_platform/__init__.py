"""energon-platform's public Python API: import these names from ``energon_platform`` itself.

Module paths below the package (``energon_platform.loader.train_loader`` ...) are internal and may
move; the names in `__all__` stay (``tests/test_public_api.py`` pins the list and
``docs/reference/api.md`` documents it). Importing the package is cheap: each name is imported on
first use (PEP 562), so ``import energon_platform`` does not load torch.

The trainer integrations are public modules of their own, because each works with its framework:
``energon_platform.integrations.lightning``, ``.accelerate``, ``.deepspeed``, ``.dcp``, ``.megatron``
(the same page lists the names each one keeps; the package top imports none of them, except
that a loader started while Lightning is imported imports Lightning's, see `loader.on_start`).
"""

from __future__ import annotations

import importlib as _importlib
import sys as _sys

from energon_platform.loader import on_start as _on_start
from storage.lazy_exports import lazy_exports

#: public name -> module that defines it
_NAMES = {
    "load_config": "energon_platform.config",
    "RunConfig": "energon_platform.config",
    "TrainLoader": "energon_platform.loader.train_loader",
    "build_val_loader": "energon_platform.loader.val_loader",
    "build_encoder": "energon_platform.loader.run_plan",
    "gradient_accumulation_steps": "energon_platform.loader.layout",
    "StateMismatchError": "energon_platform.loader.state",
    "LayoutError": "energon_platform.loader.schedule",
    "StepLog": "energon_platform.training.step_log_writer",
    "batch_digest": "energon_platform.training.step_log_writer",
    "to_device": "energon_platform.integrations.device",
    "record_run": "energon_platform.training.run_record",
}

__all__ = sorted(_NAMES)
__getattr__, __dir__ = lazy_exports(__name__, _NAMES)

#: the trainer frameworks whose integration must be in force when they drive a TrainLoader, by
#: the top package of each: a loader started while one is imported imports its integration
_FRAMEWORK_INTEGRATIONS = {
    "lightning": "energon_platform.integrations.lightning",
    "pytorch_lightning": "energon_platform.integrations.lightning",
}


def _integrations_of_loaded_frameworks() -> None:
    """Import the integration of each framework already imported (`loader.on_start`): Lightning's
    checkpoint of a loader one batch ahead is then refused even where the user's script never
    imported ``energon_platform.integrations.lightning`` itself."""
    for framework, integration in _FRAMEWORK_INTEGRATIONS.items():
        if framework in _sys.modules and integration not in _sys.modules:
            _importlib.import_module(integration)


_on_start.register(_integrations_of_loaded_frameworks)
