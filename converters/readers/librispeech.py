"""LibriSpeech layout: ``SPK/CHAP/SPK-CHAP-UTT.flac`` and ``SPK/CHAP/SPK-CHAP.trans.txt``.

Transcript lines are ``UTT-ID TRANSCRIPT``. Key = the utterance id (already key-safe). Chapters
(every folder holding audio files or a transcript) are visited in sorted order, utterances in
transcript order. Nothing is dropped silently: an audio file without a transcript line, a chapter
with audio but no (readable) transcript file, and a transcript line without its audio file are all
reported.
"""

from __future__ import annotations

from pathlib import Path

from converters.readers import AUDIO_EXTENSIONS, decode_text, existing_dir, undecodable_name
from converters.records import Media, Problem, ReadResult, Record, make_key


def _chapter_audio(chapter_dir: Path, problems: list[Problem]) -> dict[str, Path]:
    audio = {}
    for p in sorted(chapter_dir.iterdir()):
        if p.suffix.lower() not in AUDIO_EXTENSIONS:
            continue
        utt = p.name.split(".")[0]
        if undecodable_name(p.name):
            problems.append(
                Problem(
                    "invalid_file_name",
                    undecodable_name(utt),
                    f"{undecodable_name(p.name)}: the file name is not UTF-8; rename it",
                )
            )
        elif utt in audio:
            problems.append(
                Problem(
                    "duplicate_id", utt, f"{p.name}: {audio[utt].name} has the same utterance id"
                )
            )
        else:
            audio[utt] = p
    return audio


def _transcript_lines(trans: Path, problems: list[Problem]) -> list[str]:
    try:
        raw_lines = trans.read_bytes().splitlines()
    except OSError as e:
        problems.append(
            Problem("missing_file", trans.name, f"cannot read {trans}: {e.strerror or e}")
        )
        return []
    lines = []
    for lineno, raw in enumerate(raw_lines, 1):
        try:
            lines.append(decode_text(raw).strip())
        except UnicodeDecodeError as e:
            problems.append(Problem("invalid_utf8", f"{trans.name}:{lineno}", str(e)))
    return lines


def _read_chapter(
    base: Path, chapter_dir: Path, transcripts: list[Path], problems: list[Problem]
) -> list[Record]:
    audio = _chapter_audio(chapter_dir, problems)
    records, listed = [], set()
    for trans in transcripts:
        for line in _transcript_lines(trans, problems):
            if not line:
                continue
            utt, _, text = line.partition(" ")
            listed.add(utt)
            if not text.strip():
                problems.append(Problem("empty_text", utt, "empty transcript"))
                continue
            if utt not in audio:
                problems.append(
                    Problem("missing_file", utt, f"no audio file for {utt} in {chapter_dir}")
                )
                continue
            speaker, chapter = (utt.split("-") + ["", ""])[:2]
            records.append(
                Record(
                    key=make_key(utt),
                    source_id=utt,
                    media=Media(path=str(audio[utt]), name=audio[utt].relative_to(base).as_posix()),
                    texts=(text.strip(),),
                    extra={"speaker": speaker, "chapter": chapter},
                )
            )
    where = (
        ", ".join(t.name for t in transcripts)
        or f"no *.trans.txt in {chapter_dir.relative_to(base).as_posix() or '.'}"
    )
    for utt in sorted(set(audio) - listed):
        problems.append(
            Problem("empty_text", utt, f"{audio[utt].name} has no transcript line ({where})")
        )
    return records


def read(root: str) -> ReadResult:
    base = existing_dir(root, "LibriSpeech root")
    chapters: dict[Path, list[Path]] = {}
    for p in sorted(base.rglob("*")):
        if p.name.endswith(".trans.txt"):
            chapters.setdefault(p.parent, []).append(p)
        elif p.suffix.lower() in AUDIO_EXTENSIONS:
            chapters.setdefault(p.parent, [])
    records, problems = [], []
    for chapter_dir in sorted(chapters):
        records += _read_chapter(base, chapter_dir, chapters[chapter_dir], problems)
    return ReadResult("audio", records, problems)
