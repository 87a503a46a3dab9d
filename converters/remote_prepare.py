"""``energon-platform prepare msc://...``: index a WebDataset already on object storage, in place.

For a user whose tars are already on a prefix (not written by ``convert``): every ``*.tar`` under
it is walked header by header with ranged GETs (`converters.shard_index.RangedObject`:
member data is skipped, a small member after a header comes in the same request), its
``.tar.idx`` is put next to it, and ``.nv-meta`` (``index.sqlite``, ``.info.json``,
``split.yaml``, ``index.uuid``) is built locally from the records (Energon's own index writer,
`RecordPreparator`) and uploaded. Shards under ``train/`` and
``val/`` form those splits; otherwise every shard is ``train``. No ``dataset.yaml`` is written
(the sample type of a foreign WebDataset is the user's to state, as with ``energon prepare``);
one already on the prefix is kept. Returns what it read: requests and bytes against the tars' size.

Refused with a one-line `ConvertError`, before anything is written:

- a path that is not ``msc://`` (a local folder is Energon's ``energon prepare``);
- a prefix a conversion wrote (its ``.convert/state.json`` or ``report.json``): it is indexed
  already, and a new ``index.uuid`` would orphan the checkpoints and length caches made on it;
- a tar that is not whole: not a tar, cut short (its members or its end-of-archive blocks run
  past the object's end), or holding no sample; the message names the shard;
- a sample key in two shards (Energon's index needs every key once).

``index.uuid`` is derived from every tar's name, size, ETag and index record: preparing the same
tars again keeps it; a tar changed in any of these (same names and sample counts or not) changes it.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import tarfile
import tempfile
import uuid
from pathlib import Path

from converters.energon_meta import META
from converters.output import STATE_FILE, ConvertError
from converters.remote import is_remote, upload_file
from converters.remote_target import Prefix, open_prefix
from converters.shard_index import RangedObject, RecordPreparator, tar_idx_bytes, tar_record
from storage import storage_errors

#: A tar ends with two zero blocks of this size after its last member.
_BLOCK = 512


def prepare_prefix(url: str, readahead: int = 64 << 10) -> dict:
    """Index the WebDataset at ``url`` (module doc). Raises ``ConvertError`` when it is refused
    or holds no tar."""
    if not is_remote(url):
        raise ConvertError(
            f"{url}: prepare takes an msc://PROFILE/prefix URL (tars on object storage); "
            f"for a local folder of tars run Energon's `energon prepare {url}`"
        )
    prefix = open_prefix(url.rstrip("/"))
    listing = prefix.listing()
    objects = {rel: o.content_length for rel, o in listing.items()}
    _refuse_a_conversion(prefix, objects)
    shards = sorted(k for k in objects if k.endswith(".tar"))
    if not shards:
        raise ConvertError(f"{prefix.url}: no *.tar object under the prefix; nothing to prepare")
    records, requests, read = {}, 0, 0
    for rel in shards:  # every shard checked before anything is written
        records[rel], f = _shard_record(prefix, rel, objects[rel], readahead)
        requests, read = requests + f.requests, read + f.bytes_read
    _refuse_duplicate_keys(prefix, records)
    for rel in shards:
        with storage_errors(prefix.url, rel + ".idx"):
            prefix.client.write(prefix.full_key(rel + ".idx"), tar_idx_bytes(records[rel]))
    identity = hashlib.sha256(
        json.dumps([[r, objects[r], listing[r].etag, records[r]] for r in shards]).encode()
    ).hexdigest()
    _upload_meta(prefix, shards, records, identity)
    return {
        "url": prefix.url,
        "shards": len(shards),
        "samples": sum(len(r["samples"]) for r in records.values()),
        "requests": requests,
        "bytes_read": read,
        "tar_bytes": sum(objects[r] for r in shards),
        "has_dataset_yaml": f"{META}/dataset.yaml" in objects,
    }


def _refuse_a_conversion(prefix: Prefix, objects: dict[str, int]) -> None:
    """A prefix ``convert`` wrote is indexed already (module doc)."""
    found = [k for k in (STATE_FILE, "report.json") if k in objects]
    if found:
        raise ConvertError(
            f"{prefix.url} holds a conversion written by `energon-platform convert` (found "
            f"{found[0]}), indexed when it was written; nothing was changed; prepare is for tars put "
            f"on a prefix by hand (check this one with `energon-platform verify {prefix.url}`)"
        )


def _shard_record(prefix: Prefix, rel: str, size: int, readahead: int) -> tuple[dict, RangedObject]:
    """The index record of the tar at ``rel`` and the ranged reader that read it; a tar that is
    not whole (module doc) is a ``ConvertError`` naming it."""

    def refuse(why: str) -> ConvertError:
        return ConvertError(
            f"{prefix.url}/{rel}: {why}; nothing was written; replace or remove this shard and "
            f"run prepare again"
        )

    with storage_errors(prefix.url, rel):
        f = RangedObject(prefix.client, prefix.full_key(rel), size, readahead)
        try:
            record = tar_record(f)
        except tarfile.TarError as e:
            raise refuse(f"not a tar, or cut short ({e}; {size} bytes)") from None
        # the first end block was read to find the end; the second is only sized
        f.seek(record["end"])
        if f.read(_BLOCK) != bytes(_BLOCK) or size < record["end"] + 2 * _BLOCK:
            raise refuse(
                f"cut short or not a whole tar: no end-of-archive blocks after its last member "
                f"(members end at byte {record['end']} of {size})"
            )
    if not record["samples"]:
        raise refuse("holds no sample (no member named KEY.PART)")
    return record, f


def _refuse_duplicate_keys(prefix: Prefix, records: dict[str, dict]) -> None:
    """Energon's index refuses a sample key in two shards (or twice in one): name the first."""
    seen: dict[str, str] = {}
    for rel, record in records.items():
        for key, _, _ in record["samples"]:
            if key in seen:
                raise ConvertError(
                    f"{prefix.url}: sample key {key!r} is in {seen[key]} and {rel}; nothing was "
                    f"written; Energon needs every key once (rename the members, or see "
                    f"`energon prepare --fix-duplicates`)"
                )
            seen[key] = rel


def _upload_meta(
    prefix: Prefix, shards: list[str], records: dict[str, dict], identity: str
) -> None:
    """Build ``.nv-meta`` from the records (Energon's index writer) and upload it, ``.info.json``
    last (it makes the prefix a dataset)."""
    splits = [
        (s, rf"^{s}/.*") for s in ("train", "val") if any(r.startswith(f"{s}/") for r in shards)
    ]
    RecordPreparator.records = staticmethod(records.__getitem__)
    with tempfile.TemporaryDirectory(prefix="energon-platform-prepare-") as tmp:
        with contextlib.redirect_stdout(io.StringIO()):
            RecordPreparator.prepare_dataset(
                Path(tmp),
                shards,
                split_parts_patterns=splits or [("train", ".*")],
                shuffle_seed=None,
                workers=1,
            )
        (Path(tmp) / META / "index.uuid").write_text(
            str(uuid.uuid5(uuid.NAMESPACE_URL, f"energon-platform:{identity}"))
        )
        for name in ("index.sqlite", "index.uuid", "split.yaml", ".info.json"):
            upload_file(str(Path(tmp) / META / name), f"{prefix.url}/{META}/{name}")
