"""Our shard reader gives Energon's raw samples: the same dicts as its ITarReader, for every tar flavour."""

from __future__ import annotations

import io
import tarfile

import numpy as np
import pytest

from energon_platform.loader.shard_reader import _members, _members_tarfile
from energon_platform.loader.source import SampleSource


def tar_bytes(fmt, members):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
@pytest.mark.parametrize("members", [
    [("k.image.png", b"\x89PNG" + bytes(600)), ("k.text.json", b'{"caption": "x"}')],
    [("a/b/c/key.text.json", b"{}"), ("key.audio.flac", b"")],  # a prefix, an empty member
    [("x" * 150 + ".image.png", b"\x01" * 513)],  # a long name: GNU or pax headers
])
def test_fast_member_parsing_equals_tarfile(fmt, members):
    if fmt == tarfile.USTAR_FORMAT and len(members[0][0]) > 100 and "/" not in members[0][0]:
        pytest.skip("ustar cannot store a 150-character name without a slash")
    data = tar_bytes(fmt, members)
    assert [(n, read()) for n, read in _members(data)] == [(n, read()) for n, read in _members_tarfile(data)] \
        == members


def test_raw_samples_equal_energons_reader_in_a_random_order(image_text_shards):
    from megatron.energon.flavors.webdataset.itar_reader import ShardInfosITarReader

    source = SampleSource(str(image_text_shards))
    f = source._factory
    energon = ShardInfosITarReader(f.path, f.shards, part_filter=f.part_filter, sample_filter=f.sample_filter)
    source[0]
    for i in np.random.default_rng(0).permutation(len(source)).tolist():
        assert source._reader[i] == energon[i], i
