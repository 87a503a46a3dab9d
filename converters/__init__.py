"""Raw corpora → Energon-ready WebDataset shards.

Data flow: ``readers`` (one per source kind, yield ordered ``Record``s, never decode media) →
``units`` (a work unit is one output shard: a slice of records and its final name) → ``writer``
(validates and encodes media, writes one tar deterministically to a temporary name, renames it) →
``executor`` (local processes or Ray tasks run the same units) → ``finish`` (report, Energon
prepare, ``dataset.yaml``).

Shard contract (what ``task_encoders`` and ``energon_platform`` rely on):

* Output layout: ``OUT/train/shard-000000.tar``, ``OUT/val/shard-000000.tar``, ``OUT/.nv-meta/``
  (Energon index, ``split.yaml``, ``dataset.yaml``), ``OUT/report.json``; ``OUT/.convert/`` holds
  the resume state and the lock (see `converters.output` for what ``--overwrite`` removes).
* Tar members: ``KEY.image.<ext>`` (``png`` by default) or ``KEY.audio.<ext>`` (``flac`` by
  default, at the source's 16 or 24 bits; ``wav`` for 32-bit integer and float PCM, which FLAC
  cannot hold), plus ``KEY.text.json``. ``<ext>`` always names the detected format, never the
  source file's name; a text-only sample (``convert text``) has ``KEY.text.json`` alone. Keys match
  ``[A-Za-z0-9_-]+`` (no dots: Energon splits member names at the first dot), are at most 100
  characters, unique per dataset and stable across reconversions.
* ``text.json`` of an image sample: ``{"caption": str, "captions": [str, ...], "source": {...}}``;
  of an audio sample or a text document: ``{"text": str, "source": {...}}``. ``source`` carries
  provenance: the reader kind, source id, original file name and ``width``/``height`` or
  ``duration`` and ``sample_rate`` (a document: ``manifest_row``).
* Image datasets load as Energon's ``CaptioningSample``; audio datasets as
  `converters.sample_types.AudioTextSample`; text datasets as Energon's ``TextSample``.
"""

from storage.lazy_exports import lazy_exports

#: exported name -> module that defines it (imported on first use)
_NAMES = {
    "run_conversion": "converters.convert",
    "ConvertOptions": "converters.convert",
    "ConvertError": "converters.convert",
    "summarize": "converters.convert",
    "InputError": "converters.readers",
    "ImageOptions": "converters.media",
    "AudioOptions": "converters.media",
    "VideoOptions": "converters.media",
    "dataset_info": "converters.info",
    "verify_dataset": "converters.verify",
    "prepare_prefix": "converters.remote_prepare",
    "upload_dataset": "converters.remote",
}

__all__ = sorted(_NAMES)
__getattr__, __dir__ = lazy_exports(__name__, _NAMES)
