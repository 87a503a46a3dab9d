"""Integrations with the trainers users run. Each module is public: import from it directly
(``from energon_platform.integrations.lightning import EnergonHooks``); its ``__all__`` lists
what it offers.

* [`megatron`][energon_platform.integrations.megatron]: Megatron-LM's ``--dataloader-type external``
  provider, per-data-parallel-rank state files, ``get_batch`` dicts (vision-language included).
* [`dcp`][energon_platform.integrations.dcp]: the loader as one ``Stateful`` entry of a
  ``torch.distributed.checkpoint`` (torchtitan) checkpoint: no pickle, elastic.
* [`lightning`][energon_platform.integrations.lightning]: hooks for a ``LightningModule`` whose loader state
  rides in Lightning's checkpoint.
* [`accelerate`][energon_platform.integrations.accelerate]: the loader registered with Accelerate's
  ``save_state`` / ``load_state``.
* [`deepspeed`][energon_platform.integrations.deepspeed]: the loader state in a DeepSpeed checkpoint's
  ``client_state``.
"""

from storage.lazy_exports import lazy_exports

#: exported name -> module that defines it (imported on first use)
_NAMES = {
    "accelerate": "energon_platform.integrations.accelerate",
    "dcp": "energon_platform.integrations.dcp",
    "deepspeed": "energon_platform.integrations.deepspeed",
    "device": "energon_platform.integrations.device",
    "lightning": "energon_platform.integrations.lightning",
    "megatron": "energon_platform.integrations.megatron",
}

__all__ = sorted(_NAMES)
__getattr__, __dir__ = lazy_exports(__name__, _NAMES)
