"""A *light* sample: the Energon sample type of a dataset with its media left as file bytes.

`light_sample` reads sample ``i`` of an opened `SampleSource`
through the project's shard reader and builds the dataset's sample type through its field map or
sample loader, exactly as Energon's factory does, but without Energon's media decoder: ``.json``
parts are parsed, ``.txt`` parts decoded as UTF-8, every other part (images, audio, video) stays
``bytes``. What an encoder's ``sample_facts`` reads (text, image headers, audio headers, the
converter's ``text.json`` provenance) is all there, at the cost of one ranged read and no decoding.
"""

from __future__ import annotations

import json
from typing import Any, cast

from megatron.energon.flavors.webdataset.default_generic_webdataset import (
    DefaultGenericWebdatasetFactory,
)
from megatron.energon.flavors.webdataset.structs import FilteredSample

from energon_platform.loader.source import tag_sample_key


def decode_light_parts(raw: dict) -> FilteredSample:
    """``raw`` (part name → bytes, plus ``__key__`` etc.) with ``.json`` parts parsed and ``.txt``
    parts decoded; other parts unchanged."""
    out = {}
    for name, value in raw.items():
        if isinstance(value, (bytes, bytearray)) and not name.startswith("__"):
            if name.endswith(".json"):
                value = json.loads(value)
            elif name.endswith(".txt"):
                value = bytes(value).decode("utf-8")
        out[name] = value
    return cast(FilteredSample, out)  # Energon's record: its ``__`` keys and the sample's parts


def light_sample(source: Any, index: int) -> Any:
    """The light sample of dataset index ``index`` of ``source`` (module doc). ``KeyError`` when the
    index is excluded from the dataset; a bad record raises with ``sample_key`` set, as
    ``SampleSource[index]`` does."""
    source._ensure_reader()
    raw = source._reader[index]
    if isinstance(raw, Exception):
        raise raw
    if raw is None:
        raise KeyError(f"sample {index} is excluded from the dataset")
    try:
        return DefaultGenericWebdatasetFactory.load_sample(source._factory, decode_light_parts(raw))
    except Exception as e:
        tag_sample_key(e, raw.get("__key__"))
        raise
