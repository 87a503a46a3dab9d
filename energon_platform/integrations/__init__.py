"""Integrations with other trainers.

* :mod:`~energon_platform.integrations.megatron`: Megatron-LM's ``--dataloader-type external``
  provider, per-data-parallel-rank state files, ``get_batch`` dicts.
"""
