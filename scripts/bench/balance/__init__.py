"""Compute balance across data-parallel ranks: today, a naive sort-and-deal, Energon's packing, ours.

    python -m scripts.bench.balance [--json PATH] [--quick] [--steps 500] [--ranks 8 64] [--rows-per-rank 2]
        [--train | --sections balance train] [--train-steps 40] [--train-rounds 3]
    (from the repository root)

A skewed synthetic blend of per-sample lengths (seeded NumPy, drawn lazily per position, so every
variant reads the *same* stream): ``image_text`` = tiles (uniform 1..12) x ``--tokens-per-tile``
plus a lognormal caption; ``audio`` = a duration uniform in 1..30 s x ``--audio-fps`` frames per
second plus a lognormal transcript; ``text`` = a lognormal document. Every length is clipped to
``--seq-len``; the kinds are mixed i.i.d. by ``--weights``. A sample's row length and work length
are the same number here (image tiles and audio frames count as the positions the model sees).

For each number of simulated ranks R (``--ranks``), K rows (packed) or samples (unpacked) per rank
(``--rows-per-rank``), ``--steps`` steps and both cost models (``tokens``: cost = L; ``attention``:
cost = L² + c·L, c = ``--linear``, default ``--seq-len``), the per-step max/mean of the ranks'
summed cost (reported as p50/p90/max over steps) for:

* ``none`` (today). Unpacked: R·K consecutive samples, sliced contiguously to ranks. Packed: R·K
  pack groups of ``--pack-group`` consecutive samples, each packed first-fit decreasing (the
  encoders' ``select_samples_to_pack``) into a variable number of rows, groups dealt contiguously
  (K per rank), so rows per rank vary.
* ``naive``: the same global batch of samples as ``none``, sorted by cost (longest first) and dealt
  round-robin; packed, each rank then packs its samples first-fit decreasing (rows vary).
* ``energon`` (packed only; unpacked it is ``none``: each rank batches its own consecutive
  samples): Energon's ``PackingDataset`` at the same settings: each rank reads its own contiguous
  blocks of ``--packing-buffer-size`` samples (block j to rank j mod R), packs each block first-fit
  decreasing and batches the packs, K rows per step. Nothing is dropped; no rank sees another's
  samples, so rows per rank are fixed but their cost is not balanced.
* ``ours``: :class:`energon_platform.loader.balance.planner.Planner`, then ``deal_plan``. Packed: R·K rows
  of ``--seq-len`` per global batch, dealt with ``fixed=True``. Unpacked: ``ours`` plans R·K samples of
  like cost around the oldest of a pool of 32 global batches (no budget) and deals them K per rank;
  ``ours-budget`` plans with a cost budget (``budget=`` R·K x the blend's mean cost, measured on a
  calibration draw) and deals with free counts. Also reported: padding (mean ``BatchPlan.padding``),
  the most carried samples, the state size in bytes (``json.dumps(PlanState.to_json())`` after the
  last step), the planner's time per global batch and ``bound``: per step, a lower bound of max/mean
  that any dealing of that batch's rows (samples) must reach (the costliest item plus the K-1
  cheapest on one rank), which tells a planning limit (which samples and rows form the batch) from a
  dealing one.

A rank's cost is the sum of its samples' costs (padding is not counted: the cost models measure
useful work). Then ratios ours/none and ours/energon of the p90 max/mean, and whether the balance
targets are met (p90 max/mean <= 1.05 for 8 ranks x 2 rows or samples in both cost models; padding
<= 2%). Every figure is measured in this run; nothing is typed in. ``--check`` exits 1 when a
target is missed. Sections are listed in ``runner.SECTIONS``, one module of this package each
(``common`` holds what they share): a later one (e.g. the reference model's tokens/s on 2 gloo
ranks) adds its module there.

``--train`` (minutes) adds the ``train`` section: the last balance figure, the reference model's
tokens/s on 2 gloo ranks (``torchrun``, one rank per core, ``num_workers: 0``) on a skewed blend of
the embedded corpora (converted into a temporary folder), today (``balance: none``: global batches
of pack groups, rows per rank vary) against ours (``balance: attention``: fixed rows), each global
batch about the same tokens; runs interleaved (today, ours, today, ours, ...) against load drift.
``--sections train`` runs it alone. ``--sections train-measured`` (minutes) trains the two-tower
model on skewed image-caption data (1-12 tiles per image, lognormal captions), today against
``balance: measured`` (its cost file calibrated first, on this data) and ``attention``, and reports
optimizer steps/s. ``--sections llava`` calibrates megatron-core's own ``LLaVAModel``
(tiny, on the CPU) on vision-language micro-batches of the embedded captions: R² and the held-back
p90 error against the same targets as the two-tower model's.
"""
