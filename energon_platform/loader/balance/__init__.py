"""Balanced batching, in one place: every global batch planned from its samples' lengths and
costs before any media is decoded (``loader.balance``: ``tokens``, ``attention``, ``encoder``,
``measured``).

* `lengths`: the length index (each sample's facts, built once) and the lengths of stream
  positions at their epoch (`SampleLengths`);
* `costs`, `cost_file`, `cost_history`: what a sample costs under each cost model, a calibrated
  cost file, and which cost model planned which global batch;
* `plans` (the state and a plan, as data), `pool` (the samples a batch is planned from, each
  dataset's epochs fenced), `planner` (`Planner`: packed rows, like-cost samples, a budget),
  `packer` (rows and budgets), `dealing` (rows to ranks and micro-batches, and the bound of
  any dealing);
* `planned`: `PlannedBatching`, the batching mode (`energon_platform.loader.batching`) that
  the loader, the trace and the state ask.
"""
