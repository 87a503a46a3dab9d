"""NeMo-style audio manifests: JSONL lines ``{"audio_filepath", "text", "duration"}``.

Paths resolve relative to the manifest's folder. Key = the ``id`` field if present (``0`` is an
id; a missing, ``null`` or empty one is not), else the audio path without extension. ``duration`` is
kept as declared provenance; the writer measures the real duration when it decodes.
"""

from __future__ import annotations

from pathlib import Path

from converters.readers import caption_texts, existing_file
from converters.readers.tables import iter_rows
from converters.records import Media, Problem, ReadResult, Record, id_text, make_key


def read(manifest: str) -> ReadResult:
    path = existing_file(manifest, "audio manifest")
    records, problems = [], []
    for n, row in iter_rows(path, "jsonl"):
        if isinstance(row, Problem):
            problems.append(row)
            continue
        audio = row.get("audio_filepath")
        if not isinstance(audio, str) or not audio:
            problems.append(Problem("malformed_line", f"line {n}", "no 'audio_filepath'"))
            continue
        source_id = id_text(row.get("id")) or str(Path(audio).with_suffix(""))
        texts, bad = caption_texts(row.get("text"), "text")
        if bad:
            problems.append(Problem(bad[0], source_id, f"line {n}: {bad[1]}"))
            continue
        if not texts:
            problems.append(Problem("empty_text", source_id, f"line {n}: empty 'text'"))
            continue
        extra = (
            {"declared_duration": row["duration"]}
            if isinstance(row.get("duration"), (int, float))
            else {}
        )
        records.append(
            Record(
                key=make_key(source_id),
                source_id=source_id,
                media=Media(path=str((path.parent / audio).resolve()), name=audio),
                texts=texts,
                extra=extra,
            )
        )
    return ReadResult("audio", records, problems)
