"""``energon-platform prepare msc://...``: index a WebDataset already on object storage, in place.

For a user whose tars are already on a prefix (not written by ``convert``): every ``*.tar`` under
it is walked header by header with ranged GETs (:class:`converters.shard_index.RangedObject`:
member data is skipped, a small member after a header comes in the same request), its
``.tar.idx`` is put next to it, and ``.nv-meta`` (``index.sqlite``, ``.info.json``,
``split.yaml``, ``index.uuid``) is built locally from the records (Energon's own index writer,
:class:`~converters.shard_index.RecordPreparator`) and uploaded. Shards under ``train/`` and
``val/`` form those splits; otherwise every shard is ``train``. No ``dataset.yaml`` is written
(the sample type of a foreign WebDataset is the user's to state, as with ``energon prepare``);
one already on the prefix is kept. Returns what it read: requests and bytes against the tars' size.
"""

from __future__ import annotations

import hashlib
import tempfile
import uuid
from pathlib import Path

from converters.energon_meta import META
from converters.output import ConvertError
from converters.remote import upload_file
from converters.remote_target import open_prefix
from converters.shard_index import RangedObject, RecordPreparator, tar_idx_bytes, tar_record
from storage import storage_errors


def prepare_prefix(url: str, readahead: int = 64 << 10) -> dict:
    """Index the WebDataset at ``url`` (module doc). Raises ``ConvertError`` when it holds no tar."""
    import contextlib
    import io

    prefix = open_prefix(url.rstrip("/"))
    objects = prefix.objects()
    shards = sorted(k for k in objects if k.endswith(".tar"))
    if not shards:
        raise ConvertError(f"{prefix.url}: no *.tar object under the prefix; nothing to prepare")
    records, requests, read = {}, 0, 0
    for rel in shards:
        with storage_errors(prefix.url, rel):
            f = RangedObject(prefix.client, f"{prefix.key}/{rel}", objects[rel], readahead)
            records[rel] = tar_record(f)
            requests, read = requests + f.requests, read + f.bytes_read
            prefix.client.write(f"{prefix.key}/{rel}.idx", tar_idx_bytes(records[rel]))
    splits = [(s, rf"^{s}/.*") for s in ("train", "val") if any(r.startswith(f"{s}/") for r in shards)]
    RecordPreparator.records = staticmethod(records.__getitem__)
    with tempfile.TemporaryDirectory(prefix="energon-platform-prepare-") as tmp:
        with contextlib.redirect_stdout(io.StringIO()):
            RecordPreparator.prepare_dataset(Path(tmp), shards, split_parts_patterns=splits or [("train", ".*")],
                                             shuffle_seed=None, workers=1)
        identity = hashlib.sha256(repr(sorted((r, objects[r]) for r in shards)).encode()).hexdigest()
        (Path(tmp) / META / "index.uuid").write_text(str(uuid.uuid5(uuid.NAMESPACE_URL, f"energon-platform:{identity}")))
        for name in ("index.sqlite", "index.uuid", "split.yaml", ".info.json"):  # .info.json last: commits
            upload_file(str(Path(tmp) / META / name), f"{prefix.url}/{META}/{name}")
    return {"url": prefix.url, "shards": len(shards), "samples": sum(len(r["samples"]) for r in records.values()),
            "requests": requests, "bytes_read": read, "tar_bytes": sum(objects[r] for r in shards),
            "has_dataset_yaml": f"{META}/dataset.yaml" in objects}
