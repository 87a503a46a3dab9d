"""The generators of the embedded default corpora, one module per corpus (``coco``, with
``photos``, ``shapes`` and ``conversations``; ``librispeech``, ``text``, ``video``, ``mesh``) and
``common``. ``scripts/make_default_data.py`` is their command line and documents the output."""
