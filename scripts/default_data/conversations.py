"""coco_mini's ``conversations.json``: hand-written conversations about the photos."""

from __future__ import annotations

import json
from pathlib import Path

# (id, photo ids, turns). Written by hand while looking at each photo; answers say only what the
# photo shows. "<image>" marks where an image goes; an entry with fewer placeholders than images
# (conv-0025) gets them in front of its first question, one entry has a system turn, and two
# are text only.
CONVERSATIONS: list[tuple[str, list[int], list[tuple[str, str]]]] = [
    (
        "conv-0001",
        [1],
        [
            ("human", "<image>\nWhat is the person wearing?"),
            ("gpt", "An orange spacesuit with mission patches on it."),
            ("human", "Is there a flag in the picture?"),
            ("gpt", "Yes, an American flag on the left."),
            ("human", "What is behind her on the right?"),
            ("gpt", "A model of the space shuttle. A white helmet is in front of her."),
        ],
    ),
    (
        "conv-0002",
        [2],
        [
            ("human", "<image>\nWhat surface is shown here?"),
            ("gpt", "A brick wall, seen close up in black and white."),
            ("human", "How are the bricks laid?"),
            ("gpt", "In staggered rows of long, narrow bricks with light mortar between them."),
        ],
    ),
    (
        "conv-0003",
        [3],
        [
            ("human", "<image>\nWhat is the man doing?"),
            ("gpt", "He is looking through a camera mounted on a tripod."),
            ("human", "Where is he standing?"),
            ("gpt", "On a grassy field, with buildings far away in the background."),
        ],
    ),
    (
        "conv-0004",
        [4],
        [
            ("human", "<image>\nHow many cells can you see?"),
            ("gpt", "One round, bright cell."),
            ("human", "Where is it in the frame?"),
            ("gpt", "A little right of the centre, on a plain gray background."),
        ],
    ),
    (
        "conv-0005",
        [5],
        [
            ("human", "<image>\nWhat animal is this?"),
            ("gpt", "A tabby cat, seen close up."),
            ("human", "What colour are its eyes?"),
            ("gpt", "Green."),
        ],
    ),
    (
        "conv-0006",
        [6],
        [
            ("human", "<image>\nIs the object in focus?"),
            ("gpt", "No. It is a round wall clock, blurred sideways by motion."),
        ],
    ),
    (
        "conv-0007",
        [7],
        [
            ("human", "<image>\nWhat drink is in the cup?"),
            ("gpt", "An espresso with golden crema."),
            ("human", "What colour is the saucer?"),
            ("gpt", "Red, like the cup."),
            ("human", "Is there a spoon?"),
            ("gpt", "Yes, a small metal spoon lies on the saucer."),
        ],
    ),
    (
        "conv-0008",
        [8],
        [
            ("human", "<image>\nHow many coins are there?"),
            ("gpt", "Twenty four, in four rows of six."),
        ],
    ),
    (
        "conv-0009",
        [9],
        [
            ("human", "<image>\nWhat colour is the centre of the wheel?"),
            ("gpt", "White."),
            ("human", "And the background?"),
            ("gpt", "Black."),
        ],
    ),
    (
        "conv-0010",
        [10],
        [
            ("human", "<image>\nIs this photo in colour?"),
            ("gpt", "No, it is a grayscale close-up of grass and small leaves."),
        ],
    ),
    (
        "conv-0011",
        [11],
        [
            ("human", "What is shown in this picture?\n<image>"),
            ("gpt", "Many small gravel stones, in grayscale."),
        ],
    ),
    (
        "conv-0012",
        [12],
        [
            ("human", "<image>\nWhat animal is shown?"),
            ("gpt", "A horse, drawn as a black silhouette on a white background."),
            ("human", "Which way is it facing?"),
            ("gpt", "To the right."),
        ],
    ),
    (
        "conv-0013",
        [13],
        [
            ("human", "<image>\nWhat does this image show?"),
            ("gpt", "A deep space telescope image full of distant galaxies."),
        ],
    ),
    (
        "conv-0014",
        [14],
        [
            ("human", "<image>\nWhat kind of image is this?"),
            ("gpt", "A microscope image of stained tissue."),
            ("human", "Which colours does the stain show?"),
            ("gpt", "Brown and blue."),
        ],
    ),
    (
        "conv-0015",
        [15],
        [
            ("human", "<image>\nWhat is drawn inside the circle?"),
            ("gpt", "A snake."),
            ("human", "Which colours does the logo use?"),
            ("gpt", "Green and orange."),
        ],
    ),
    (
        "conv-0016",
        [16],
        [
            ("human", "<image>\nWhat part of the body is this?"),
            ("gpt", "A small grayscale crop of a retina, with blood vessels and two dark spots."),
        ],
    ),
    (
        "conv-0017",
        [17],
        [
            ("human", "<image>\nWhat surface is this?"),
            ("gpt", "The surface of the moon, with small craters."),
        ],
    ),
    (
        "conv-0018",
        [18],
        [
            ("human", "<image>\nWhat vehicle is this?"),
            ("gpt", "A motorcycle."),
            ("human", "What colour is it?"),
            ("gpt", "Red, with a black seat."),
            ("human", "Where is it parked?"),
            ("gpt", "In a garage, in front of shelves with boxes."),
        ],
    ),
    (
        "conv-0019",
        [19],
        [
            ("human", "<image>\nWhat is the heading of the page?"),
            ("gpt", "Region-based segmentation."),
        ],
    ),
    (
        "conv-0020",
        [20],
        [
            ("human", "<image>\nWhat does this photo show?"),
            (
                "gpt",
                "The back of a human eye, with red blood vessels spreading from a bright spot.",
            ),
        ],
    ),
    (
        "conv-0021",
        [21],
        [
            ("human", "<image>\nWhat stands on the launch pad?"),
            ("gpt", "A rocket, between tall towers."),
            ("human", "Is it day or night?"),
            ("gpt", "Dusk: the sky is dark blue and the lights are on."),
        ],
    ),
    (
        "conv-0022",
        [22],
        [
            ("human", "<image>\nIs the writing printed or handwritten?"),
            ("gpt", "Handwritten. It looks like mathematical notes, photographed at an angle."),
        ],
    ),
    (
        "conv-0023",
        [5, 12],
        [
            ("human", "<image>\n<image>\nWhich of the two pictures shows a cat?"),
            ("gpt", "The first one. The second shows the silhouette of a horse."),
        ],
    ),
    (
        "conv-0024",
        [7, 18],
        [
            (
                "human",
                "<image>\n<image>\nWhat colour do the saucer in the first picture and "
                "the motorcycle in the second share?",
            ),
            ("gpt", "Both are red."),
        ],
    ),
    (
        "conv-0025",
        [13, 17],
        [
            ("human", "Which picture shows distant galaxies, the first or the second?"),
            ("gpt", "The first. The second shows the surface of the moon."),
        ],
    ),
    (
        "conv-0026",
        [],
        [
            ("human", "What does a tripod do for a camera?"),
            ("gpt", "It holds the camera steady on three legs."),
        ],
    ),
    (
        "conv-0027",
        [],
        [
            ("system", "Answer in one short sentence."),
            ("human", "What is an espresso?"),
            ("gpt", "A small, strong coffee made by forcing hot water through ground beans."),
        ],
    ),
]


def write_conversations(root: Path, images: list) -> int:
    """``conversations.json`` (LLaVA instruction format, paths relative to ``images/``) for the
    photos that were written; an entry whose photo is missing is left out."""
    files = {im["id"]: im["file_name"] for im in images if im.get("kind") != "generated"}
    entries = []
    for conv_id, photo_ids, turns in CONVERSATIONS:
        if not all(i in files for i in photo_ids):
            continue
        entry = {"id": conv_id}
        if len(photo_ids) == 1:
            entry["image"] = files[photo_ids[0]]
        elif photo_ids:
            entry["images"] = [files[i] for i in photo_ids]
        entry["conversations"] = [{"from": who, "value": text} for who, text in turns]
        entries.append(entry)
    (root / "conversations.json").write_text(
        json.dumps(entries, indent=1, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    return len(entries)
