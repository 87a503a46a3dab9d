#!/usr/bin/env python3
"""Train the project's small byte-level BPE tokenizer, offline and deterministically.

Training text, in this order:

1. every caption of ``<data>/coco_mini/captions.json``,
2. every transcript of ``<data>/librispeech_mini/**/*.trans.txt`` (upper case, as in the files),
3. a built-in list of plain English paragraphs (``ENGLISH_TEXT`` below) so that common words get
   sensible tokens, plus the same paragraphs in upper case so that LibriSpeech-style transcripts
   do not fall apart into single letters.

The tokenizer is GPT-2 style byte-level BPE (``tokenizers`` library): ByteLevel pre-tokenizer
without an added prefix space, ByteLevel decoder, so ``decode(encode(text))`` gives ``text``
back exactly for any string (all 256 bytes are in the base alphabet; ``<unk>`` is never
produced). Special tokens: ``<pad>``=0, ``<bos>``=1, ``<eos>``=2, ``<unk>``=3. Encoding does NOT
insert ``<bos>``/``<eos>`` by itself: task encoders add them explicitly where they want them.

Added special tokens (``ADDED_SPECIAL_TOKENS``): ``<image>``, the image placeholder of
vision-language encoders and of megatron-core's ``LLaVAModel`` (``IMAGE_TOKEN``). BPE is trained to
``--vocab-size`` minus their number, and they are appended after it, as Megatron-LM's
``--special-tokens`` appends them to a tokenizer folder: ``<image>`` = 2047, the vocabulary stays
2048 in all. Adding it this way kept every other id of the earlier 2048-token tokenizer; only its
last merge (``Ġteacher``, in none of the corpora's captions or transcripts) is gone.

Output (``--out``, default ``task_encoders/assets/tokenizer/``): ``tokenizer.json``,
``tokenizer_config.json`` (``tokenizer_class`` ``PreTrainedTokenizerFast``,
``model_max_length`` 4096) and ``special_tokens_map.json``, loadable offline with
``transformers.AutoTokenizer.from_pretrained(dir)``. Two runs give byte-identical files.
"""

from __future__ import annotations

import os

# Single-threaded training: BPE merge order must not depend on thread scheduling.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("RAYON_RS_NUM_CPUS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA = REPO_ROOT / "data"
DEFAULT_OUT = REPO_ROOT / "task_encoders" / "assets" / "tokenizer"

VOCAB_SIZE = 2048
SPECIAL_TOKENS = ["<pad>", "<bos>", "<eos>", "<unk>"]  # ids 0, 1, 2, 3
ADDED_SPECIAL_TOKENS = ["<image>"]  # appended after the BPE vocabulary: id 2047
MODEL_MAX_LENGTH = 4096

ENGLISH_TEXT = [
    "The quick brown fox jumps over the lazy dog. A small cat sat on the warm mat by the door, "
    "and a large dog slept under the old wooden table in the kitchen.",
    "This is a picture of a man and a woman walking along the beach at sunset. They are holding "
    "hands, and the sky above them is orange, pink and purple.",
    "There are two children playing with a red ball in the park. One of them is running, the "
    "other one is laughing and trying to catch it.",
    "A group of people are standing on a street corner, waiting for the bus to arrive. Some of "
    "them are looking at their phones while others talk to each other.",
    "The train left the station early in the morning and travelled through green fields, small "
    "villages and long dark tunnels before it reached the city.",
    "She opened the window and looked out at the garden. The flowers were white and yellow, the "
    "grass was still wet from the rain, and birds were singing in the trees.",
    "He put the book back on the shelf, turned off the light and went to bed. It had been a long "
    "day, and he was very tired.",
    "We can see a plate of food on the table: there is bread, cheese, some fruit, a bowl of soup "
    "and a glass of water next to a cup of coffee.",
    "In the middle of the image there is a tall building with many windows. On the left side "
    "there is a tree, and on the right side a car is parked near the road.",
    "The weather today is cold and cloudy, with a chance of snow in the afternoon. Tomorrow will "
    "be sunny and a little warmer, but the wind will be strong.",
    "Please read the following sentence out loud and then write it down in your notebook. Try to "
    "speak slowly and clearly so that everyone can hear you.",
    "Music is made of sounds that rise and fall. A note can be high or low, short or long, loud "
    "or quiet. When three notes are played together they form a chord.",
    "The first number is one, then come two, three, four, five, six, seven, eight, nine and ten. "
    "After that we count eleven, twelve, twenty, thirty, a hundred and a thousand.",
    "Colours we use every day include red, green, blue, yellow, orange, purple, pink, brown, "
    "black, white and gray. Light colours are pale, dark colours are deep.",
    "Simple shapes are easy to draw: a circle is round, a square has four equal sides, a "
    "triangle has three corners, and a star has five points.",
    "The boat moved slowly across the lake. A few ducks were swimming near the shore, and a "
    "fisherman was sitting quietly on a rock with his line in the water.",
    "After lunch the students went back to the classroom, where the teacher was writing a new "
    "lesson on the board about the history of the old town.",
    "A photograph captures a single moment in time. Good photos often have a clear subject, "
    "interesting light, and a simple background that does not distract the eye.",
    "The scientist looked through the microscope at the sample and saw hundreds of tiny cells. "
    "Some were round, some were long, and a few were moving.",
    "At night the sky was full of stars. Far away, beyond our own galaxy, there are billions of "
    "other galaxies, each one with billions of stars of its own.",
    "My friend asked me what time it was, and I told her that it was almost half past three. "
    "We still had enough time to buy tickets before the show started.",
    "Could you please pass me the salt? Thank you very much. This soup is really good, but I "
    "think it needs a little more pepper as well.",
    "The road goes up the hill, past the farm and the church, and then down into the valley "
    "where the river flows under a narrow stone bridge.",
    "It is important to keep your data clean. Every file should have a name, every record "
    "should have an id, and every caption should describe what is really in the picture.",
    "Once upon a time there was a little house at the edge of a forest. An old man lived there "
    "with his dog, his two goats and a very clever black and white cat.",
    "When the phone rang, nobody answered it. Everyone was outside in the yard, watching the "
    "fireworks light up the sky over the river.",
    "Is this the right way to the museum? Yes, go straight ahead, turn left at the traffic "
    "lights, and you will find it on your right, opposite the bank.",
    "People have always told stories. They tell them to teach, to remember, to warn and to make "
    "each other laugh, and the best stories are told again and again.",
]


def read_corpus(data: Path) -> list[str]:
    """All training lines, in a fixed order."""
    lines: list[str] = []
    cap_file = data / "coco_mini" / "captions.json"
    if not cap_file.is_file():
        raise SystemExit(f"missing {cap_file} (run scripts/make_default_data.py first)")
    doc = json.loads(cap_file.read_text(encoding="utf-8"))
    lines += [a["caption"] for a in sorted(doc["annotations"], key=lambda a: a["id"])]

    ls_root = data / "librispeech_mini"
    trans = sorted(ls_root.rglob("*.trans.txt"))
    if not trans:
        raise SystemExit(f"no *.trans.txt under {ls_root} (run scripts/make_default_data.py)")
    for t in trans:
        for line in t.read_text(encoding="utf-8").splitlines():
            if line.strip():
                lines.append(line.split(" ", 1)[1])

    lines += ENGLISH_TEXT
    lines += [p.upper() for p in ENGLISH_TEXT]
    return lines


def train(lines: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(lines, trainer=trainer, length=len(lines))
    for i, t in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(t) == i, (t, tok.token_to_id(t))
    base = tok.get_vocab_size()
    tok.add_special_tokens(ADDED_SPECIAL_TOKENS)
    for i, t in enumerate(ADDED_SPECIAL_TOKENS):
        assert tok.token_to_id(t) == base + i, (t, tok.token_to_id(t))
    return tok


def _write_json(path: Path, obj) -> None:
    path.write_text(
        json.dumps(obj, indent=2, ensure_ascii=False, sort_keys=True) + "\n", encoding="utf-8"
    )


def save(tok, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    # Re-serialise tokenizer.json with sorted keys and a fixed layout (the library's own
    # pretty printer is stable too, but this pins the byte layout to json.dumps).
    raw = json.loads(tok.to_str())
    (out / "tokenizer.json").write_text(
        json.dumps(raw, indent=1, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    special = {
        "pad_token": "<pad>",
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "unk_token": "<unk>",
    }
    _write_json(out / "special_tokens_map.json", special)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": MODEL_MAX_LENGTH,
        "padding_side": "right",
        "truncation_side": "right",
        "clean_up_tokenization_spaces": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(tok.token_to_id(t)): {
                "content": t,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for t in SPECIAL_TOKENS + ADDED_SPECIAL_TOKENS
        },
        **special,
    }
    _write_json(out / "tokenizer_config.json", config)


def check(out: Path, probes: list[str]) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from transformers import AutoTokenizer

    t = AutoTokenizer.from_pretrained(str(out))
    assert t.is_fast, type(t)
    assert (t.pad_token_id, t.bos_token_id, t.eos_token_id, t.unk_token_id) == (0, 1, 2, 3)
    for token in ADDED_SPECIAL_TOKENS:
        token_id = t.convert_tokens_to_ids(token)
        assert t.encode(f"{token}\nA photo.", add_special_tokens=False)[0] == token_id, token
        assert t.decode([token_id], skip_special_tokens=True) == ""
    for s in probes:
        ids = t.encode(s, add_special_tokens=False)
        back = t.decode(ids, skip_special_tokens=True)
        assert back == s, (s, back)
        ids2 = [t.bos_token_id] + ids + [t.eos_token_id]
        assert t.decode(ids2, skip_special_tokens=True) == s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--data",
        type=Path,
        default=DEFAULT_DATA,
        help="folder holding coco_mini/ and librispeech_mini/ "
        f"(default: {DEFAULT_DATA.relative_to(REPO_ROOT)}/ in the repo)",
    )
    ap.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help=f"output folder (default: {DEFAULT_OUT.relative_to(REPO_ROOT)}/)",
    )
    ap.add_argument(
        "--vocab-size",
        type=int,
        default=VOCAB_SIZE,
        help=f"target vocabulary size incl. special tokens (default {VOCAB_SIZE})",
    )
    ap.add_argument(
        "--no-check",
        action="store_true",
        help="skip loading the result with transformers.AutoTokenizer",
    )
    args = ap.parse_args(argv)

    lines = read_corpus(args.data)
    tok = train(lines, args.vocab_size - len(ADDED_SPECIAL_TOKENS))
    save(tok, args.out)
    probes = [
        "a large red circle on a light blue background",
        "NOTE C NOTE E NOTE G",
        "A smiling astronaut in an orange spacesuit.",
        "  two  spaces, tabs\tand ünïcödé ✓",
    ]
    if not args.no_check:
        check(args.out, probes)
    n_words = sum(len(x.split()) for x in lines)
    example = tok.encode(probes[0]).tokens
    print(
        f"tokenizer: vocab {tok.get_vocab_size()} (target {args.vocab_size}, added {ADDED_SPECIAL_TOKENS}), trained on "
        f"{len(lines)} lines / {n_words} words; wrote {args.out}"
    )
    print(f"  {probes[0]!r} -> {len(example)} tokens {example}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
