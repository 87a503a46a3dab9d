"""``librispeech_mini/``: synthesised musical notes in the LibriSpeech layout."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import soundfile as sf

from .common import SEED

SR = 16000
NOTE_SEMITONES = {"C": 0, "D": 2, "E": 4, "F": 5, "G": 7, "A": 9, "B": 11}
NOTE_ORDER = ["C", "D", "E", "F", "G", "A", "B"]
NUMBER_WORDS = {2: "TWO", 3: "THREE", 4: "FOUR", 5: "FIVE", 6: "SIX"}
CHORDS = {  # name -> (root, semitone offsets above the root)
    "MAJOR": (0, 4, 7),
    "MINOR": (0, 3, 7),
}
# speaker id -> (octave of the notes, harmonic amplitudes 1..n: its timbre)
SPEAKERS = {
    9001: (3, (1.0, 0.55, 0.35, 0.25, 0.15)),  # low, bright
    9002: (4, (1.0, 0.0, 0.33, 0.0, 0.2, 0.0, 0.14)),  # middle, hollow (odd harmonics)
    9003: (5, (1.0, 0.12)),  # high, nearly pure
}
CHAPTERS = {100: 0.30, 101: 0.22}  # chapter id -> seconds per note (tempo)
UTTERANCES_PER_CHAPTER = 8
PAUSE_S = 0.15
EDGE_S = 0.05  # silence at both ends


def note_freq(name: str, octave: int) -> float:
    midi = 12 * (octave + 1) + NOTE_SEMITONES[name]
    return 440.0 * 2.0 ** ((midi - 69) / 12.0)


def tone(freqs: list[float], dur: float, harmonics) -> np.ndarray:
    n = int(round(dur * SR))
    t = np.arange(n, dtype=np.float64) / SR
    x = np.zeros(n)
    for f in freqs:
        for k, a in enumerate(harmonics, start=1):
            if a and f * k < SR / 2 - 500:
                x += a * np.sin(2 * np.pi * f * k * t)
    env = np.ones(n)
    att, rel = int(0.01 * SR), int(0.04 * SR)
    env[:att] = np.linspace(0.0, 1.0, att, endpoint=False)
    env[n - rel :] = np.linspace(1.0, 0.0, rel)
    return x * env


def make_utterance(rng: random.Random, note_s: float) -> tuple[list, str]:
    """A list of events ("note", [names]) / ("pause", None) and the transcript saying them."""
    kind = rng.choice(["sequence", "sequence", "rising", "falling", "repeat", "chord", "pause"])
    if kind == "chord":
        root = rng.choice(NOTE_ORDER)
        quality = rng.choice(sorted(CHORDS))
        art = "AN" if root in "AEF" else "A"  # letter names said aloud: "an A", "an E", "an F"
        return [("chord", (root, quality))], f"{art} {root} {quality} CHORD"
    max_notes = max(2, min(6, int((2.5 - 2 * EDGE_S - PAUSE_S) / note_s)))
    if kind == "repeat":
        name, n = rng.choice(NOTE_ORDER), rng.randint(2, min(4, max_notes))
        return [("note", name)] * n, f"NOTE {name} {NUMBER_WORDS[n]} TIMES"
    n = rng.randint(3 if kind in ("rising", "falling") else 2, max_notes)
    if kind in ("rising", "falling"):
        idx = sorted(rng.sample(range(len(NOTE_ORDER)), n))
        names = [NOTE_ORDER[i] for i in (idx if kind == "rising" else idx[::-1])]
        text = f"{NUMBER_WORDS[n]} {kind.upper()} NOTES {' '.join(names)}"
        return [("note", x) for x in names], text
    names = [rng.choice(NOTE_ORDER) for _ in range(n)]
    if kind == "pause":
        cut = rng.randint(1, n - 1)
        events = (
            [("note", x) for x in names[:cut]]
            + [("pause", None)]
            + [("note", x) for x in names[cut:]]
        )
        words = [f"NOTE {x}" for x in names[:cut]] + ["PAUSE"] + [f"NOTE {x}" for x in names[cut:]]
        return events, " ".join(words)
    return [("note", x) for x in names], " ".join(f"NOTE {x}" for x in names)


def render(events, octave: int, harmonics, note_s: float) -> np.ndarray:
    parts = [np.zeros(int(EDGE_S * SR))]
    for ev, arg in events:
        if ev == "pause":
            parts.append(np.zeros(int(PAUSE_S * SR)))
        elif ev == "note":
            parts.append(tone([note_freq(arg, octave)], note_s, harmonics))
        else:  # chord: three notes at once, held for 0.8 s
            root, quality = arg
            f0 = note_freq(root, octave)
            parts.append(tone([f0 * 2.0 ** (s / 12.0) for s in CHORDS[quality]], 0.8, harmonics))
    parts.append(np.zeros(int(EDGE_S * SR)))
    x = np.concatenate(parts)
    peak = np.max(np.abs(x))
    x = x / peak * 0.5 if peak > 0 else x
    return np.round(x * 32767.0).astype(np.int16)


def make_librispeech(out: Path) -> dict:
    root = out / "librispeech_mini"
    rng = random.Random(SEED + 1)
    n_utt, total_s = 0, 0.0
    durations = []
    for spk in sorted(SPEAKERS):
        octave, harmonics = SPEAKERS[spk]
        for chap in sorted(CHAPTERS):
            note_s = CHAPTERS[chap]
            d = root / str(spk) / str(chap)
            d.mkdir(parents=True)
            lines = []
            for u in range(UTTERANCES_PER_CHAPTER):
                while True:
                    events, text = make_utterance(rng, note_s)
                    audio = render(events, octave, harmonics, note_s)
                    dur = len(audio) / SR
                    if 0.6 <= dur <= 2.5:
                        break
                utt = f"{spk}-{chap}-{u:04d}"
                sf.write(d / f"{utt}.flac", audio, SR, format="FLAC", subtype="PCM_16")
                lines.append(f"{utt} {text}")
                n_utt += 1
                total_s += dur
                durations.append(dur)
            (d / f"{spk}-{chap}.trans.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return {
        "n_utterances": n_utt,
        "total_seconds": total_s,
        "min_seconds": min(durations),
        "max_seconds": max(durations),
    }
