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
@pytest.mark.parametrize(
    "members",
    [
        [("k.image.png", b"\x89PNG" + bytes(600)), ("k.text.json", b'{"caption": "x"}')],
        [("a/b/c/key.text.json", b"{}"), ("key.audio.flac", b"")],  # a prefix, an empty member
        [("x" * 150 + ".image.png", b"\x01" * 513)],  # a long name: GNU or pax headers
    ],
)
def test_fast_member_parsing_equals_tarfile(fmt, members):
    if fmt == tarfile.USTAR_FORMAT and len(members[0][0]) > 100 and "/" not in members[0][0]:
        pytest.skip("ustar cannot store a 150-character name without a slash")
    data = tar_bytes(fmt, members)
    assert (
        [(n, read()) for n, read in _members(data)]
        == [(n, read()) for n, read in _members_tarfile(data)]
        == members
    )


def test_raw_samples_equal_energons_reader_in_a_random_order(image_text_shards):
    from megatron.energon.flavors.webdataset.itar_reader import ShardInfosITarReader

    source = SampleSource(str(image_text_shards))
    f = source._factory
    energon = ShardInfosITarReader(
        f.path, f.shards, part_filter=f.part_filter, sample_filter=f.sample_filter
    )
    source[0]
    for i in np.random.default_rng(0).permutation(len(source)).tolist():
        assert source._reader[i] == energon[i], i


@pytest.fixture
def counted_reads(monkeypatch):
    """Every ``open`` of a ``.tar.idx`` and every ``os.pread`` of this process, as they happen."""
    import builtins
    import os

    reads = {"index": [], "range": []}
    real_open, real_pread = builtins.open, os.pread

    def counting_open(file, *args, **kwargs):
        if str(file).endswith(".tar.idx"):
            reads["index"].append(str(file))
        return real_open(file, *args, **kwargs)

    def counting_pread(fd, size, offset):
        reads["range"].append((fd, offset, size))
        return real_pread(fd, size, offset)

    monkeypatch.setattr(builtins, "open", counting_open)
    monkeypatch.setattr(os, "pread", counting_pread)
    return reads


def test_each_index_is_read_once_and_each_sample_is_one_ranged_read(
    image_text_shards, counted_reads
):
    """The reader's contract (module doc): a shard's .tar.idx is read once, not per sample, and a
    sample is one byte range. A random order over every shard, twice."""
    source = SampleSource(str(image_text_shards))
    order = np.random.default_rng(1).permutation(len(source)).tolist() * 2
    counted_reads["index"].clear()
    for i in order:
        assert source[i].__key__
    assert len(counted_reads["index"]) <= len(source.shard_counts), counted_reads["index"]
    assert len(set(counted_reads["index"])) == len(source.shard_counts)  # and it did count them
    assert len(counted_reads["range"]) == len(order)


def test_fetch_many_reads_each_index_once_and_one_range_per_run(image_text_shards, counted_reads):
    """The object-storage read path, on local files: a batch of indices costs one index read per
    shard (none once cached) and one ranged read per run of consecutive indices in one shard."""
    source = SampleSource(str(image_text_shards))
    source._ensure_reader()
    reader = source._reader
    wanted = [0, 1, 2, 9, 17, 23]  # runs: [0-2] in shard 0, [9] in shard 1, [17], [23] in shard 2
    got = reader.fetch_many(wanted)
    assert sorted(got) == wanted and not any(isinstance(v, Exception) for v in got.values())
    assert len(counted_reads["index"]) == 3 and len(counted_reads["range"]) == 4
    reader.fetch_many([5, 6, 12])
    assert len(counted_reads["index"]) == 3, "the indices are cached"
    assert len(counted_reads["range"]) == 6
