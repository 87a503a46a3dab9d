"""``text_mini/``: short documents about the other corpora and the platform."""

from __future__ import annotations

import json
from pathlib import Path

from .common import article
from .librispeech import (
    CHAPTERS,
    CHORDS,
    NOTE_ORDER,
    NOTE_SEMITONES,
    PAUSE_S,
    SPEAKERS,
    UTTERANCES_PER_CHAPTER,
    note_freq,
)
from .photos import PHOTOS
from .shapes import BACKGROUNDS, COLOURS, PATTERNS, SHAPES

TEXT_FILE = "documents.jsonl"

# file inside skimage/data -> a few true sentences about what the photo shows
PHOTO_FACTS = {
    "astronaut.png": "Astronauts train for years before a spaceflight. The bright orange suit is worn for "
    "launch and landing, and its colour makes a crew member easy to find after a landing at sea.",
    "brick.png": "Bricks are blocks of fired clay. Laying each row offset by half a brick from the row below "
    "spreads the load and makes the wall stronger.",
    "camera.png": "This cameraman picture is one of the classic test images of image processing. A tripod holds "
    "a camera steady, so long exposures and slow pans stay sharp.",
    "cell.png": "Cells are the smallest units of living things. A light microscope magnifies them enough to show "
    "their outline and, with staining, parts such as the nucleus.",
    "chelsea.png": "Tabby is not a breed of cat but a coat pattern of stripes, swirls or spots. In coco_mini this "
    "photo is stored sideways with an EXIF orientation tag of 6, so a reader must rotate it to "
    "show the cat upright.",
    "clock_motion.png": "Motion blur appears when the camera or the subject moves while the shutter is open. "
    "Here the round face of the clock is smeared sideways into a streak.",
    "coffee.png": "Espresso is made by forcing hot water through finely ground coffee under pressure. The "
    "golden foam on top is called crema.",
    "coins.png": "People have struck coins from metal for more than two and a half thousand years. This photo "
    "is often used to test how well a program separates objects from their background.",
    "color.png": "A colour wheel arranges the hues in a circle, with red, yellow, green, cyan, blue and magenta "
    "following each other. Two colours opposite each other on the wheel are called complementary.",
    "grass.png": "Grass grows from the base of its leaves rather than from the tips, so a lawn keeps growing "
    "after it is mowed. A texture image like this one has no single object, only a repeating pattern.",
    "gravel.png": "Gravel is made of loose rock fragments, larger than grains of sand and smaller than cobbles. "
    "Crushed gravel has sharp edges, while river gravel is rounded by water.",
    "horse.png": "A silhouette shows only the outline of a shape, filled with one colour. Binary images like "
    "this horse are used to test shape analysis such as skeletonization.",
    "hubble_deep_field.jpg": "The Hubble Deep Field was made from many exposures of one tiny patch of sky, taken "
    "by the Hubble Space Telescope in 1995. Almost every point of light in it is a galaxy.",
    "ihc.png": "Immunohistochemistry uses antibodies to stain chosen proteins in a tissue sample. In this slide "
    "the brown stain marks the protein and the blue stain marks the cell nuclei.",
    "logo.png": "scikit-image is an open source library of image processing algorithms for Python. Its logo "
    "includes a snake, the usual symbol of the Python language.",
    "microaneurysms.png": "Microaneurysms are tiny bulges in the walls of small blood vessels of the retina. "
    "They show up as small dark dots and are an early sign of diabetic retinopathy.",
    "moon.png": "The surface of the Moon is covered with craters left by asteroids and comets. Since the Moon "
    "has almost no air and no weather, its craters stay sharp for a very long time.",
    "motorcycle_left.png": "This photo is the left view of a stereo pair, the same scene taken from two nearby "
    "positions. Comparing the two views lets a program estimate how far away each point is.",
    "page.png": "The page photo shows printed text under uneven lighting. It is used to test thresholding, where "
    "a program decides for every pixel whether it belongs to the ink or to the paper.",
    "retina.jpg": "The retina is the light-sensitive layer at the back of the eye. The bright disc is where the "
    "optic nerve leaves the eye; it has no light receptors, which makes a blind spot.",
    "rocket.jpg": "A rocket carries both its fuel and the oxygen to burn it, so it can fly where there is no "
    "air. Towers next to a launch pad carry fuel lines and cables, and some protect the rocket "
    "from lightning.",
    "text.png": "Handwriting recognition turns pictures of written characters into text that a computer can "
    "search. A page photographed at an angle, like this one, is usually straightened first.",
}
SHAPE_FACTS = {
    "circle": "A circle is the set of points at the same distance from its centre. Its circumference is pi "
    "times its diameter, a little more than three times.",
    "square": "A square has four equal sides and four right angles. Its two diagonals have the same length and "
    "cross at right angles.",
    "triangle": "The triangles are equilateral and point up: all three sides have the same length and every "
    "angle is 60 degrees.",
    "star": "The stars have five points. Their outline has ten corners, alternating between the tips and the "
    "inner corners, which are 42 percent as far from the centre as the tips.",
    "diamond": "A diamond here is a rhombus standing on one corner, taller than it is wide. All four of its "
    "sides have the same length.",
    "hexagon": "A regular hexagon has six equal sides and six angles of 120 degrees. Bees build the cells of "
    "their honeycomb in this shape.",
    "cross": "The crosses are plus signs: two bars of the same length crossing at their middles at a right "
    "angle.",
    "ring": "A ring is a disc with a round hole in the middle. In these images the hole is a little more than "
    "half as wide as the ring and shows the background colour.",
}
PATTERN_FACTS = {
    "horizontal stripes": "Horizontal stripes run from the left edge of the image to the right edge.",
    "vertical stripes": "Vertical stripes run from the top of the image to the bottom.",
    "checkerboard": "A checkerboard alternates squares of two colours in rows and columns, so that no two "
    "squares sharing a side have the same colour.",
}
# What the platform does, in plain words: (id, text). Each entry is a short paragraph.
PLATFORM_FACTS = [
    (
        "shard",
        "A shard is a tar file that holds many samples one after the other. Reading a few large files "
        "is much faster than reading millions of small ones, on local disks and on object storage alike.",
    ),
    (
        "sample-key",
        "Every sample in a shard has a key, and all files of one sample share it, such as KEY.image.png "
        "and KEY.text.json. A key never contains a dot, because the loader splits file names at the "
        "first dot.",
    ),
    (
        "text-json",
        "The text.json part of a sample holds its caption, transcript or document text together with "
        "provenance: the source kind, the source id and the original file name.",
    ),
    (
        "energon-index",
        "The .nv-meta folder of a dataset holds the index that Energon builds over its shards. With "
        "the index, the loader can read any sample directly, without scanning the shards before it.",
    ),
    (
        "dataset-yaml",
        "The dataset.yaml file names the sample type of a dataset and says which part of each sample "
        "fills which field. A text dataset maps the text field to the text entry of text.json.",
    ),
    (
        "work-unit",
        "A conversion is cut into work units, one unit for each output shard. Units are independent, "
        "so they can run in local processes or as Ray tasks and still write the same bytes.",
    ),
    (
        "atomic-write",
        "Each shard is first written under a temporary name and renamed once it is complete. A "
        "reader therefore sees either the whole shard or no shard at all.",
    ),
    (
        "convert-resume",
        "A conversion that is killed can be run again with the same arguments. It writes only the "
        "shards that are missing, and the result is byte for byte the same as an uninterrupted run.",
    ),
    (
        "bad-input",
        "Bad input is skipped and counted, never silently dropped. The report lists each reason, such "
        "as empty text or invalid UTF-8, with examples, and skipped.jsonl lists every skipped record.",
    ),
    (
        "val-split",
        "The validation split is chosen by a hash of each sample key. A sample therefore lands in the "
        "same split whatever else is in the corpus.",
    ),
    (
        "data-loader",
        "A data loader reads samples, turns them into tensors and groups them into batches while the "
        "model trains. Worker processes prepare the next batches in the background.",
    ),
    (
        "global-batch",
        "A global batch is everything one training step consumes across all data-parallel ranks. "
        "Each rank takes its own part of every global batch.",
    ),
    (
        "micro-batch",
        "When a rank cannot fit its whole share in memory, it splits it into micro-batches and adds "
        "up their gradients before the optimizer step.",
    ),
    (
        "epoch",
        "An epoch visits every sample of a dataset once. Here the order of each epoch is a permutation "
        "computed from the seed and the epoch number, so every epoch is shuffled differently but "
        "reproducibly.",
    ),
    (
        "seeded-augmentation",
        "Random augmentations, such as crops and flips, are drawn from a generator seeded by "
        "the run seed, the sample key and the epoch. The same sample in the same epoch always "
        "gets the same tensors, whichever worker encodes it.",
    ),
    (
        "packing",
        "Packing places several short documents into one sequence, so fewer tokens are wasted on "
        "padding. Position ids restart at every document and cu_seqlens marks where each one begins.",
    ),
    (
        "checkpoint",
        "A checkpoint stores the model, the optimizer, the learning rate schedule, the random number "
        "generators and the state of the data loader. It is written to a temporary folder and renamed, "
        "so a crash never leaves half a checkpoint behind.",
    ),
    (
        "loader-state",
        "The state of the loader is a small JSON document: mainly the number of the next global "
        "batch. Restoring it takes as long as starting fresh, because nothing is replayed.",
    ),
    (
        "fingerprint",
        "The loader state carries a fingerprint of the dataset, the encoder configuration, the seed "
        "and the batch size. A state restored into a different setup is refused with an error that "
        "names the difference.",
    ),
    (
        "exact-resume",
        "After a crash, training resumes from the latest checkpoint with the same samples in the same "
        "order. On a CPU the loss after the resume matches an uninterrupted run bit for bit.",
    ),
    (
        "elastic-resume",
        "A run may resume with another number of workers, or another number of ranks that divides "
        "the global batch. The global batches stay the same, because they do not depend on the layout.",
    ),
    (
        "blend",
        "A blend mixes several datasets in one run with given weights. A text corpus such as this one can "
        "join a blend with image-text and audio-text data.",
    ),
]
SEMITONE_NAMES = {0: "C", 2: "D", 4: "E", 5: "F", 7: "G", 9: "A", 11: "B"}
ACCIDENTALS = {-1: " flat", 0: "", 1: " sharp"}
TRANSCRIPT_KINDS = [
    (
        "sequence",
        "NOTE C NOTE E NOTE G",
        "A transcript such as {ex} names each note in the order it is played.",
    ),
    (
        "rising",
        "THREE RISING NOTES C E G",
        "A transcript such as {ex} says how many notes are played and that each "
        "one is higher than the one before.",
    ),
    (
        "falling",
        "FOUR FALLING NOTES B G E C",
        "A transcript such as {ex} lists notes that each sound lower than the one before.",
    ),
    (
        "repeat",
        "NOTE D THREE TIMES",
        "A transcript such as {ex} means that one note is played several times in a row.",
    ),
    (
        "pause",
        "NOTE A PAUSE NOTE D",
        "A transcript such as {ex} marks a silence of {pause} seconds between two groups of notes.",
    ),
]


def _join(items) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    items = [str(i) for i in items]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _article_text(word: str) -> str:
    return "An" if word[0] in "AEFaeiou" else "A"  # letter names said aloud: "an A", "an E", "an F"


def spell_interval(root: str, letters_up: int, semitones: int) -> str:
    """The name of the note ``semitones`` above ``root`` written ``letters_up`` letters higher
    (a third is two letters up, a fifth four), with the sharp or flat that makes it exact."""
    letter = NOTE_ORDER[(NOTE_ORDER.index(root) + letters_up) % 7]
    diff = (NOTE_SEMITONES[root] + semitones - NOTE_SEMITONES[letter]) % 12
    return letter + ACCIDENTALS[diff - 12 if diff > 6 else diff]


def text_documents() -> list[dict]:
    """All documents, in their fixed order: ``{"id", "topic", "text"}``."""
    docs = []

    def add(doc_id: str, topic: str, *sentences: str) -> None:
        docs.append({"id": doc_id, "topic": topic, "text": " ".join(sentences)})

    kinds = {"photo": "a photograph", "graphic": "a drawn image"}
    for image_id, fname, kind, captions in PHOTOS:
        add(
            f"photo-{Path(fname).stem.replace('_', '-')}",
            "coco_mini photos",
            captions[0],
            f"It is image {image_id} of coco_mini, {kinds[kind]} from the sample data of scikit-image.",
            PHOTO_FACTS[fname],
        )
    for shape in SHAPES:
        add(
            f"shape-{shape}",
            "coco_mini shapes",
            f"Many generated images of coco_mini show {article(shape)} {shape} in one of {len(COLOURS)} colours on "
            f"one of {len(BACKGROUNDS)} plain backgrounds.",
            SHAPE_FACTS[shape],
        )
    for pattern in PATTERNS:
        add(
            f"pattern-{pattern.replace(' ', '-')}",
            "coco_mini shapes",
            f"Some generated images of coco_mini are covered by {'a ' if pattern == 'checkerboard' else ''}"
            f"{pattern}, with three to six "
            f"{'squares along each side' if pattern == 'checkerboard' else 'stripes'}.",
            PATTERN_FACTS[pattern],
        )
    octaves = {spk: octave for spk, (octave, _) in SPEAKERS.items()}
    for name in NOTE_ORDER:
        freqs = _join(
            f"{note_freq(name, o):.2f} Hz in octave {o}" for o in sorted(set(octaves.values()))
        )
        add(
            f"note-{name}",
            "librispeech_mini notes",
            f"The note {name} has a frequency of {freqs}.",
            "Going up one octave doubles the frequency of a note.",
            f"In librispeech_mini, speakers {_join(sorted(octaves))} play their notes in octaves "
            f"{_join(octaves[s] for s in sorted(octaves))}, in that order.",
        )
    for spk, (octave, harmonics) in sorted(SPEAKERS.items()):
        present = [k for k, a in enumerate(harmonics, start=1) if a]
        odd = all(k % 2 for k in present)
        add(
            f"speaker-{spk}",
            "librispeech_mini speakers",
            f"Speaker {spk} of librispeech_mini is not a person but a synthesised timbre.",
            f"It plays notes in octave {octave} and mixes {len(present)} harmonics of each note"
            + (", only odd ones, which gives a hollow sound." if odd and len(present) > 1 else "."),
            f"The strongest is the fundamental; the weakest has {min(a for a in harmonics if a):.2f} of its "
            f"amplitude.",
        )
    for chap, note_s in sorted(CHAPTERS.items()):
        add(
            f"chapter-{chap}",
            "librispeech_mini chapters",
            f"Chapter {chap} of every speaker in librispeech_mini holds each note for {note_s:.2f} seconds, "
            f"about {1 / note_s:.1f} notes per second.",
            f"Each chapter has {UTTERANCES_PER_CHAPTER} utterances, and every utterance lasts between 0.6 and "
            f"2.5 seconds.",
        )
    for root in NOTE_ORDER:
        for quality in sorted(CHORDS):
            _, third, fifth = CHORDS[quality]
            notes = [root, spell_interval(root, 2, third), spell_interval(root, 4, fifth)]
            add(
                f"chord-{root}-{quality.lower()}",
                "librispeech_mini chords",
                f"{_article_text(root)} {root} {quality.lower()} chord is made of the notes {notes[0]}, {notes[1]} "
                f"and {notes[2]}.",
                f"Its third is {third} semitones above the root and its fifth is {fifth} semitones above it.",
                f"In librispeech_mini a chord is held for 0.8 seconds, and its transcript reads "
                f"{_article_text(root).upper()} {root} {quality} CHORD.",
            )
    for kind, example, template in TRANSCRIPT_KINDS:
        add(
            f"transcript-{kind}",
            "librispeech_mini transcripts",
            "The transcripts of librispeech_mini are written in capital letters and spell out what is played.",
            template.format(ex=example, pause=PAUSE_S),
        )
    for doc_id, text in PLATFORM_FACTS:
        add(f"platform-{doc_id}", "data platform", text)
    return docs


def make_text(out: Path) -> dict:
    root = out / "text_mini"
    root.mkdir(parents=True)
    docs = text_documents()
    (root / TEXT_FILE).write_text(
        "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs), encoding="utf-8"
    )
    return {"n_documents": len(docs), "n_words": sum(len(d["text"].split()) for d in docs)}
