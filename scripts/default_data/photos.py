"""coco_mini's real photos: scikit-image's bundled sample files, downscaled, as JPEG."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import numpy as np
from PIL import Image

MAX_SIDE = 512
JPEG_OPTS = dict(quality=90, optimize=False, progressive=False, subsampling=2)
EXIF_ORIENTATION_TAG = 0x0112

# (image id, file inside skimage/data, kind, captions). Captions were written by looking at the
# pictures. kind: "photo" (camera, microscope or telescope image) or "graphic" (drawn image).
PHOTOS: list[tuple[int, str, str, list[str]]] = [
    (
        1,
        "astronaut.png",
        "photo",
        [
            "A smiling astronaut in an orange spacesuit posing beside an American flag.",
            "Portrait of a woman astronaut in an orange flight suit with a helmet in front of her.",
            "An astronaut with short hair smiling, with a model of the space shuttle behind her.",
            "Official portrait of an astronaut next to a flag and a space shuttle model.",
        ],
    ),
    (
        2,
        "brick.png",
        "photo",
        [
            "A black and white close-up of a brick wall with light mortar lines.",
            "Long narrow bricks laid in staggered rows, seen at an angle.",
            "Grayscale texture of a brick surface.",
        ],
    ),
    (
        3,
        "camera.png",
        "photo",
        [
            "A black and white photo of a man looking through a camera on a tripod.",
            "A man in a dark coat filming with a camera mounted on a tripod in a grassy field.",
            "A cameraman standing on a lawn with buildings far in the background.",
        ],
    ),
    (
        4,
        "cell.png",
        "photo",
        [
            "A microscope image of a single round cell floating in liquid.",
            "A bright round cell on a gray background, seen under a microscope.",
            "Grayscale microscopy of one cell to the right of the frame.",
        ],
    ),
    (
        5,
        "chelsea.png",
        "photo",
        [
            "A close-up of a tabby cat's face with green eyes.",
            "A brown striped cat looking slightly to the side.",
            "The face of a tabby cat with a pink nose and long white whiskers.",
        ],
    ),
    (
        6,
        "clock_motion.png",
        "photo",
        [
            "A round wall clock blurred by motion against a plain gray wall.",
            "A grayscale photo of a clock smeared sideways by camera motion.",
            "A blurry bright round object in the middle of a gray background.",
        ],
    ),
    (
        7,
        "coffee.png",
        "photo",
        [
            "A cup of espresso on a red saucer with a small spoon.",
            "A red and white coffee cup on a wooden table.",
            "An espresso with golden crema in a red cup, seen from above.",
        ],
    ),
    (
        8,
        "coins.png",
        "photo",
        [
            "Ancient coins arranged in four rows on a dark background.",
            "A black and white photo of twenty four old coins.",
            "Rows of ancient coins showing heads and standing figures.",
        ],
    ),
    (
        9,
        "color.png",
        "graphic",
        [
            "A colour wheel with a white centre and every hue around it, on a black background.",
            "A circular chart of hues that fade from white in the middle to dark at the edge.",
            "A rainbow coloured disc showing red, yellow, green, cyan, blue and magenta.",
        ],
    ),
    (
        10,
        "grass.png",
        "photo",
        [
            "A grayscale close-up of grass and small leaves.",
            "Black and white texture of a lawn seen from above.",
            "Dense blades of grass photographed from above.",
        ],
    ),
    (
        11,
        "gravel.png",
        "photo",
        [
            "A grayscale image of small gravel stones.",
            "A close-up texture of crushed rock.",
            "A dense layer of angular gravel seen from above.",
        ],
    ),
    (
        12,
        "horse.png",
        "graphic",
        [
            "A black silhouette of a horse on a white background.",
            "The side view of a standing horse drawn in solid black.",
            "A horse shape facing right.",
        ],
    ),
    (
        13,
        "hubble_deep_field.jpg",
        "photo",
        [
            "A deep space telescope image full of distant galaxies.",
            "A black sky dotted with many small colourful galaxies.",
            "The Hubble deep field showing thousands of faint galaxies.",
        ],
    ),
    (
        14,
        "ihc.png",
        "photo",
        [
            "A microscope image of tissue stained brown and blue.",
            "A stained tissue sample with brown cell membranes and blue nuclei.",
            "Immunohistochemistry slide of glands in tissue under a microscope.",
        ],
    ),
    (
        15,
        "logo.png",
        "graphic",
        [
            "The scikit-image logo, a green and orange circle with a snake.",
            "A round logo split into green and orange halves by a white curved line.",
            "A circular emblem showing the head of a snake in orange and green.",
        ],
    ),
    (
        16,
        "microaneurysms.png",
        "photo",
        [
            "A small grayscale crop of a retina with blood vessels and two dark spots.",
            "A close-up retinal image with dark vessel lines and small round dots.",
        ],
    ),
    (
        17,
        "moon.png",
        "photo",
        [
            "A grayscale image of the surface of the moon with small craters.",
            "A close-up of gray lunar terrain with a bright crater in the upper left.",
            "The surface of the moon seen from above.",
        ],
    ),
    (
        18,
        "motorcycle_left.png",
        "photo",
        [
            "A red motorcycle parked in a garage.",
            "A red motorbike standing on its stand in front of shelves.",
            "A red and black motorcycle in a cluttered workshop.",
        ],
    ),
    (
        19,
        "page.png",
        "photo",
        [
            "A photo of a printed page about region-based segmentation.",
            "A grayscale picture of a book page with a heading and a line of code.",
            "Printed text explaining how to find markers of coins and background.",
        ],
    ),
    (
        20,
        "retina.jpg",
        "photo",
        [
            "A colour photo of the back of a human eye showing blood vessels.",
            "A retina image with red vessels and a bright optic disc on the left.",
            "An orange-red retina on a black background.",
        ],
    ),
    (
        21,
        "rocket.jpg",
        "photo",
        [
            "A rocket on a launch pad at dusk between tall towers.",
            "A white rocket standing upright under a dark blue evening sky.",
            "A launch pad with bright lights and tall towers around a rocket.",
        ],
    ),
    (
        22,
        "text.png",
        "photo",
        [
            "Handwritten mathematical notes photographed at an angle.",
            "A grayscale image of handwritten equations on paper.",
            "A close-up of pen writing with fractions and symbols.",
        ],
    ),
]
EXIF_ROTATED_SOURCE = "chelsea.png"
EXIF_ORIENTATION = 6  # "rotate 90 degrees clockwise to display"


def skimage_data_dir() -> Path | None:
    """The folder of sample files shipped inside the installed scikit-image (no pooch cache)."""
    try:
        import importlib.util

        spec = importlib.util.find_spec("skimage")
    except Exception:  # pragma: no cover - scikit-image missing or broken
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    d = Path(list(spec.submodule_search_locations)[0]) / "data"
    return d if d.is_dir() else None


def skimage_registry() -> dict[str, str]:
    """sha256 of scikit-image's data files, to make sure a local file is the canonical one."""
    try:
        from skimage.data._registry import registry  # private, but only used as a check

        return dict(registry)
    except Exception:  # pragma: no cover
        return {}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load_photo(path: Path) -> Image.Image:
    """Open a sample file as a fresh image (no metadata carried over), mode L or RGB."""
    with Image.open(path) as src:
        src.load()
        im = src.copy()
    if im.mode in ("RGBA", "LA", "P"):
        im = im.convert("RGBA")
        white = Image.new("RGBA", im.size, (255, 255, 255, 255))
        white.alpha_composite(im)
        im = white.convert("RGB")
    elif im.mode not in ("L", "RGB"):
        im = im.convert("RGB")
    if im.mode == "RGB":
        a = np.asarray(im)
        if np.array_equal(a[..., 0], a[..., 1]) and np.array_equal(a[..., 0], a[..., 2]):
            im = im.convert("L")  # a gray picture stored as RGB(A): keep it grayscale
    # Rebuild from raw pixels so nothing of the source's info dict (icc, dpi, exif) survives.
    im = Image.frombytes(im.mode, im.size, im.tobytes())
    w, h = im.size
    if max(w, h) > MAX_SIDE:
        s = MAX_SIDE / max(w, h)
        im = im.resize((max(1, round(w * s)), max(1, round(h * s))), Image.Resampling.LANCZOS)
    return im


def write_photos(img_dir: Path, images: list, annotations: list, info: dict) -> list[str]:
    ddir = skimage_data_dir()
    reg = skimage_registry()
    used = []
    for image_id, fname, kind, captions in PHOTOS:
        path = ddir / fname if ddir is not None else None
        if path is None or not path.is_file():
            print(f"  skip {fname}: not in the installed scikit-image", file=sys.stderr)
            continue
        want = reg.get(f"data/{fname}")
        if want is not None and _sha256(path) != want:
            print(f"  skip {fname}: sha256 differs from scikit-image's registry", file=sys.stderr)
            continue
        im = load_photo(path)
        width, height = im.size  # upright size, recorded in captions.json
        out_name = f"COCO_mini_{image_id:012d}.jpg"
        opts = dict(JPEG_OPTS)
        if fname == EXIF_ROTATED_SOURCE:
            # Store the pixels rotated 90 degrees counter-clockwise; orientation 6 tells a viewer
            # to rotate them 90 degrees clockwise, which gives the upright photo back.
            im = im.transpose(Image.Transpose.ROTATE_90)
            exif = Image.Exif()
            exif[EXIF_ORIENTATION_TAG] = EXIF_ORIENTATION
            opts["exif"] = exif.tobytes()
            info["exif_rotated_image_id"] = image_id
            info["exif_orientation"] = EXIF_ORIENTATION
        im.save(img_dir / out_name, format="JPEG", **opts)
        images.append(
            {
                "id": image_id,
                "file_name": out_name,
                "width": width,
                "height": height,
                "license": 1,
                "source": f"skimage.data/{fname}",
                "kind": kind,
            }
        )
        for cap in captions:
            annotations.append({"image_id": image_id, "caption": cap})
        used.append(fname)
    return used
