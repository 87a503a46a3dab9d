"""The loader room: which samples a position means, and how they become batches.

* :mod:`~energon_platform.loader.schedule`: the global order of a training stream, a pure
  function of (seed, position); restore is O(1) and layout-free.
* :mod:`~energon_platform.loader.source`: random access to an Energon dataset split.
* :mod:`~energon_platform.loader.batches`: positions → samples → task encoder → micro-batches.
* :mod:`~energon_platform.loader.state`: the saved state (plain JSON, versioned, fingerprinted).
* :mod:`~energon_platform.loader.train_loader`: the ``Stateful`` train loader and the val loader.
"""
