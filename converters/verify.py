"""``energon-platform verify DATASET``: every shard against the sha256 its conversion recorded.

``info`` checks what is cheap (each shard exists, with its index, at its recorded size); ``verify``
reads every byte: a shard edited in place at the same size, or bit rot, shows up only here. It
streams each shard once (local file or ``msc://`` object through Energon's ``EPath``) with a
progress bar, and reports each shard as ``ok``, ``missing``, ``changed`` (other bytes) or
``unrecorded`` (no checksum in ``report.json``: not written by ``energon-platform convert``).

Intact shards are not enough to train: every other file the loader reads must be there too
(`missing_loader_files`: each shard's ``.tar.idx``, ``.nv-meta/``'s index, split, dataset
description and identity, and ``sample_loader.py`` when ``dataset.yaml`` names it). Each missing
one is named in ``missing_files`` and makes the result not ``ok``.
"""

from __future__ import annotations

import hashlib
import json

from converters.energon_meta import META, META_FILES
from converters.readers import InputError
from storage import check_there, dataset_root, storage_errors

CHUNK = 1 << 20


def _sha256(path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def missing_loader_files(root, shards: list[str]) -> list[str]:
    """The files the loader needs besides the shards' bytes that are not under ``root`` (an
    ``EPath``): ``.nv-meta`` files, then each present shard's ``.tar.idx`` (relative names)."""
    meta = root / META
    needed = [f"{META}/{n}" for n in META_FILES]
    if (meta / "dataset.yaml").is_file() and "sample_loader.py" in (
        meta / "dataset.yaml"
    ).read_text():
        needed.append(f"{META}/sample_loader.py")
    needed += [f"{s}.idx" for s in shards if (root / s).is_file()]
    return [n for n in needed if not (root / n).is_file()]


def verify_dataset(path: str, progress: bool = True) -> dict:
    """``{"shards": {name: status}, "bad": [names], "missing_files": [names], "ok": bool,
    "bytes": checked}`` (``missing_files``: what the loader needs besides the shards, module doc)."""
    from tqdm import tqdm

    with storage_errors(path, "the dataset"):
        root = dataset_root(path)
        report_path = root / "report.json"
        if not report_path.is_file():
            check_there(path)
            raise InputError(
                f"{path}: no report.json: only datasets written by `energon-platform convert` "
                f"carry the checksums verify needs"
            )
        try:
            recorded = {
                s["shard"]: (s["sha256"], s["bytes"])
                for s in json.loads(report_path.read_text())["shards"]
            }
        except (ValueError, KeyError, TypeError) as e:
            raise InputError(
                f"{report_path}: corrupt conversion report ({type(e).__name__}: {e})"
            ) from None
        status, checked = {}, 0
        bar = tqdm(
            total=sum(b for _, b in recorded.values()),
            unit="B",
            unit_scale=True,
            desc="verify",
            disable=not progress,
        )
        for name, (digest, size) in sorted(recorded.items()):
            shard = root / name
            if not shard.is_file():
                status[name] = "missing"
            else:
                status[name] = "ok" if _sha256(shard) == digest else "changed"
                checked += size
            bar.update(size)
        bar.close()
        for split in ("train", "val"):
            for shard in (root / split).glob("*.tar"):
                status.setdefault(f"{split}/{shard.name}", "unrecorded")
        missing = missing_loader_files(root, sorted(status))
    bad = [n for n, s in status.items() if s != "ok"]
    return {
        "shards": status,
        "bad": bad,
        "missing_files": missing,
        "ok": not bad and not missing,
        "bytes": checked,
    }
