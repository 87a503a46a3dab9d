"""LibriSpeech layout: ``SPK/CHAP/SPK-CHAP-UTT.flac`` and ``SPK/CHAP/SPK-CHAP.trans.txt``.

Transcript lines are ``UTT-ID TRANSCRIPT``. Key = the utterance id (already key-safe). Chapters
are visited in sorted order, utterances in transcript order. An audio file without a transcript
line and a transcript line without its audio file are both reported.
"""

from __future__ import annotations

from converters.readers import AUDIO_EXTENSIONS, existing_dir
from converters.records import Media, Problem, ReadResult, Record, make_key


def read(root: str) -> ReadResult:
    base = existing_dir(root, "LibriSpeech root")
    records, problems = [], []
    for trans in sorted(base.rglob("*.trans.txt")):
        chapter_dir = trans.parent
        audio = {}
        for p in sorted(chapter_dir.iterdir()):
            if p.suffix.lower() not in AUDIO_EXTENSIONS:
                continue
            utt = p.name.split(".")[0]
            if utt in audio:
                problems.append(Problem("duplicate_id", utt, f"{p.name}: {audio[utt].name} has the same utterance id"))
            else:
                audio[utt] = p
        listed = set()
        for lineno, raw in enumerate(trans.read_bytes().splitlines(), 1):
            try:
                line = raw.decode("utf-8").strip()
            except UnicodeDecodeError as e:
                problems.append(Problem("invalid_utf8", f"{trans.name}:{lineno}", str(e)))
                continue
            if not line:
                continue
            utt, _, text = line.partition(" ")
            listed.add(utt)
            if not text.strip():
                problems.append(Problem("empty_text", utt, "empty transcript"))
                continue
            if utt not in audio:
                problems.append(Problem("missing_file", utt, f"no audio file for {utt} in {chapter_dir}"))
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
        for utt in sorted(set(audio) - listed):
            problems.append(Problem("empty_text", utt, f"{audio[utt].name} has no line in {trans.name}"))
    return ReadResult("audio", records, problems)
