"""Raw corpora → Energon-ready WebDataset shards.

Data flow: ``readers`` (one per source kind, yield ordered ``Record``s, never decode media) →
``units`` (a work unit is one output shard: a slice of records and its final name) → ``writer``
(validates and encodes media, writes one tar deterministically to a temporary name, renames it) →
``executor`` (local processes or Ray tasks run the same units) → ``finish`` (report, Energon
prepare, ``dataset.yaml``).

Shard contract (what ``task_encoders`` and ``energon_platform`` rely on):

* Output layout: ``OUT/train/shard-000000.tar``, ``OUT/val/shard-000000.tar``, ``OUT/.nv-meta/``
  (Energon index, ``split.yaml``, ``dataset.yaml``), ``OUT/report.json``.
* Tar members: ``KEY.image.<ext>`` (``png`` by default) or ``KEY.audio.<ext>`` (``flac`` by
  default), plus ``KEY.text.json``. Keys match ``[A-Za-z0-9_-]+`` (no dots: Energon splits member
  names at the first dot), are unique per dataset and stable across reconversions.
* ``text.json`` of an image sample: ``{"caption": str, "captions": [str, ...], "source": {...}}``;
  of an audio sample: ``{"text": str, "source": {...}}``. ``source`` carries provenance: the
  reader kind, source id, original file name and ``width``/``height`` or ``duration`` and
  ``sample_rate``.
* Image datasets load as Energon's ``CaptioningSample``; audio datasets as
  :class:`converters.sample_types.AudioTextSample`.
"""
