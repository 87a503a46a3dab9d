"""Integrations with other trainers.

* :mod:`~energon_platform.integrations.megatron`: Megatron-LM's ``--dataloader-type external``
  provider, per-data-parallel-rank state files, ``get_batch`` dicts (vision-language included).
* :mod:`~energon_platform.integrations.dcp`: the loader as one ``Stateful`` entry of a
  ``torch.distributed.checkpoint`` (torchtitan) checkpoint: no pickle, elastic.
"""
