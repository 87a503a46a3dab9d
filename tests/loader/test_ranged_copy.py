"""A ranged copy fetches a block the first time a process of the node reads from it, once per
node, and holds the published bytes where it was filled."""

from __future__ import annotations

import os

from energon_platform.loader.balance.ranged_copy import RangedCopy


def published(tmp_path, size=57):
    source = tmp_path / "published.bin"
    source.write_bytes(bytes((7 * i) % 251 for i in range(size)))
    return source


def test_a_read_fetches_only_the_blocks_that_hold_it_and_only_once(tmp_path):
    source = published(tmp_path)
    local = tmp_path / "node" / "copy.bin"
    local.parent.mkdir()
    copy = RangedCopy(str(source), local, 57, block=10)
    assert local.stat().st_size == 57 and copy.fetched == 0  # sparse, nothing read yet
    copy.ensure(12, 25)  # blocks 1 and 2
    assert copy.fetched == 20 and list(copy._filled[:]) == [0, 1, 1, 0, 0, 0]
    copy.ensure(20, 22)
    assert copy.fetched == 20  # already there
    copy.ensure(55, 57)  # the last, short block
    assert copy.fetched == 27
    whole, got = source.read_bytes(), local.read_bytes()
    assert got[10:30] == whole[10:30] and got[50:] == whole[50:]
    assert got[:10] == bytes(10)  # never read: never fetched


def test_another_process_of_the_node_reuses_what_one_fetched(tmp_path):
    source = published(tmp_path)
    local = tmp_path / "copy.bin"
    first = RangedCopy(str(source), local, 57, block=10)
    first.ensure(0, 57)
    pid = os.fork()
    if pid == 0:  # another process of the node: opens the same copy, fetches nothing
        again = RangedCopy(str(source), local, 57, block=10)
        again.ensure(0, 57)
        os._exit(0 if again.fetched == 0 and local.read_bytes() == source.read_bytes() else 1)
    assert os.waitpid(pid, 0)[1] == 0
    second = tmp_path / "other.bin"
    forked = RangedCopy(str(source), second, 57, block=10)
    pid = os.fork()
    if pid == 0:  # a forked worker fetches with its own client; its marks are the node's
        forked.ensure(30, 40)
        os._exit(0 if forked.fetched == 10 else 1)
    assert os.waitpid(pid, 0)[1] == 0
    assert list(forked._filled[:]) == [0, 0, 0, 1, 0, 0] and forked.fetched == 0
