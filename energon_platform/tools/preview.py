"""What the model sees: a batch summarised as text (`preview_batch`: field shapes and dtypes,
documents decoded back to text, for ``make demo`` and debugging), and a contact sheet of encoded
training samples as a picture (`preview`, ``energon-platform preview``; PNG, JPEG, ... by
the file's suffix): augmented images and tiles with their decoded text, a video clip's frames in a
row, an audio sample's mel spectrogram with its transcript, a point cloud from three sides, for any
encoder or blend."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from matplotlib import colormaps
from PIL import Image, ImageDraw, ImageFont, PngImagePlugin, TiffImagePlugin
from torchvision.transforms import v2

from energon_platform.config import load_config
from energon_platform.loader.balance.plans import PlanError
from energon_platform.loader.run_plan import build_encoder
from energon_platform.loader.train_loader import TrainLoader
from storage import DatasetError
from storage.outputs import OutputError, check_file, write_atomic
from storage.paths import check_there, dataset_root, is_remote
from task_encoders.config_parser import ConfigError
from task_encoders.image_text import ImageTextTaskEncoder
from task_encoders.multimodal import MultimodalTaskEncoder
from task_encoders.video_text import VideoTextTaskEncoder


def preview_batch(encoder: Any, batch: Any, max_docs: int = 2, max_chars: int = 80) -> str:
    """One line per field (``name: dtype (shape)`` for tensors), then up to ``max_docs`` documents
    as ``key: text`` decoded from the batch's tokens with the encoder's tokenizer."""
    lines = [type(batch).__name__]
    for field in dataclasses.fields(batch):
        if field.name.startswith("__"):
            continue
        value = getattr(batch, field.name)
        if isinstance(value, torch.Tensor):
            lines.append(
                f"  {field.name}: {str(value.dtype).replace('torch.', '')} {tuple(value.shape)}"
            )
        elif field.name != "keys":
            lines.append(f"  {field.name}: {value!r}")
    flat = batch.tokens.flatten()
    for j, key in enumerate(batch.keys[:max_docs]):
        start = int(batch.cu_seqlens[j])
        text = encoder.tokenizer.decode(flat[start : start + int(batch.doc_lengths[j])])
        lines.append(f"  {key}: {text[:max_chars]!r}")
    return "\n".join(lines)


# --- contact sheets ------------------------------------------------------------------------------

#: Default encoders for ``preview DATASET`` without ``--encoder``, by the dataset's sample class.
DEFAULT_ENCODERS = {
    "CaptioningSample": {"encoder": "image_text"},
    "AudioTextSample": {"encoder": "audio_text"},
    "VideoTextSample": {"encoder": "video_text"},
    # drawn in their colours
    "PointCloudTextSample": {
        "encoder": "pointcloud_text",
        "pointcloud": {"colors": True},
    },
    "TextSample": {"encoder": "text"},
}
TILE = 96  #: pixel height of an image, a video frame or a spectrogram on the sheet
MAX_TILES = 8  #: images / frames drawn per document
TEXT_WIDTH = 360  #: pixels of the text column
PAD = 6


def _tiles_per_image(images: Any, num_tiles: Any, num_images: Any) -> list[torch.Tensor] | None:
    """The tiles of each image, when ``images`` ``(T, C, h, w)`` holds the tiles of all images one
    after another, ``num_tiles`` ``(I,)`` counts them per image and ``num_images`` ``(D,)`` the
    images per document (the vision-language batch); otherwise None."""
    if not all(isinstance(t, torch.Tensor) for t in (images, num_tiles, num_images)):
        return None
    counts = num_tiles.long()
    if images.ndim != 4 or counts.numel() != int(num_images.sum()):
        return None
    if int(counts.sum()) != images.shape[0]:
        return None
    return list(torch.split(images, counts.tolist()))


def doc_media(batch: Any) -> list[list[tuple[str, torch.Tensor]]]:
    """Per document, its media as ``(kind, tensor)``: ``("image", (C, h, w))``, ``("tiles",
    (n, C, h, w))``, ``("video", (T, C, h, w))`` (real frames only), ``("points", (P, 3|6))`` (xyz
    only for a cloud whose ``has_colors`` is False) or ``("mel", (n_mels, T))`` (valid frames only).
    Reads any batch of this package: one medium per document (``image_text``, ``audio_text``,
    ``video_text``), media with per-document counts (``multimodal``), tiles (``tiles`` +
    ``num_tiles``), images of shape ``(D, n, C, h, w)``."""
    n_docs = len(batch.keys)
    out: list[list[tuple[str, torch.Tensor]]] = [[] for _ in range(n_docs)]

    def owners(count_name: str, n_items: int) -> list[int]:
        counts = getattr(batch, count_name, None)
        if isinstance(counts, torch.Tensor) and counts.numel() == n_docs:
            return torch.repeat_interleave(torch.arange(n_docs), counts.long()).tolist()
        return list(range(n_items)) if n_items == n_docs else []

    images = getattr(batch, "images", None)
    tiles, num_tiles = getattr(batch, "tiles", None), getattr(batch, "num_tiles", None)
    per_image = _tiles_per_image(images, num_tiles, getattr(batch, "num_images", None))
    if per_image is not None:  # vision-language: each image's tiles, then the images per document
        for j, image_tiles in zip(owners("num_images", len(per_image)), per_image):
            out[j].append(("tiles", image_tiles))
    elif isinstance(images, torch.Tensor) and images.ndim in (4, 5):
        for i, j in enumerate(owners("num_images", images.shape[0])):
            out[j].append(("image", images[i]) if images.ndim == 4 else ("tiles", images[i]))
    if (
        isinstance(tiles, torch.Tensor)
        and isinstance(num_tiles, torch.Tensor)
        and num_tiles.numel() == n_docs
    ):
        start = 0
        for j, n in enumerate(num_tiles.tolist()):
            if n:
                out[j].append(("tiles", tiles[start : start + n]))
            start += n
    videos = getattr(batch, "videos", None)
    if isinstance(videos, torch.Tensor) and videos.ndim == 5:
        frames = batch.num_frames.tolist()
        for i, j in enumerate(owners("num_videos", videos.shape[0])):
            out[j].append(("video", videos[i, : frames[i]]))
    points, has_colors = getattr(batch, "points", None), getattr(batch, "has_colors", None)
    if isinstance(points, torch.Tensor) and points.ndim == 3:
        for i, j in enumerate(owners("num_clouds", points.shape[0])):
            coloured = has_colors is None or bool(has_colors[i])
            out[j].append(("points", points[i] if coloured else points[i, :, :3]))
    for name, lengths_name, count_name in (
        ("features", "feature_lengths", "num_audio"),
        ("audio_features", "audio_lengths", ""),
    ):
        feats = getattr(batch, name, None)
        if (
            isinstance(feats, torch.Tensor)
            and feats.ndim == 3
            and feats.shape[1]
            and feats.shape[2]
        ):
            lengths = getattr(batch, lengths_name).tolist()
            for i, j in enumerate(
                owners(count_name, feats.shape[0]) if count_name else range(feats.shape[0])
            ):
                if lengths[i]:
                    out[j].append(("mel", feats[i, :, : lengths[i]]))
    return out


#: Batch fields the sheet reads or needs not draw: the text and its bookkeeping, the media
#: :func:`doc_media` draws, and their counts, lengths and owners.
READ_FIELDS = frozenset(
    {
        *("keys", "tokens", "labels", "loss_mask", "position_ids", "cu_seqlens", "max_seqlen"),
        *("num_docs", "doc_lengths", "modalities", "spliced_lengths", "image_token_index"),
        *("images", "num_images", "tiles", "num_tiles", "tokens_per_tile"),
        *("videos", "num_frames", "num_videos", "points", "has_colors", "num_clouds"),
        *("features", "feature_lengths", "num_audio", "audio_features", "audio_lengths"),
    }
)


def undrawn_fields(batches: list[Any]) -> dict[str, str]:
    """The fields of ``batches`` the sheet has no drawer for: tensors of two or more dimensions
    (media-like; one-dimensional ones are lengths, counts or flags) whose names are not in
    :data:`READ_FIELDS`, as ``name -> "float32 (8, 30400)"`` (dtype and the first batch's
    shape), in field order."""
    found: dict[str, str] = {}
    for batch in batches:
        for field in dataclasses.fields(batch):
            value = getattr(batch, field.name, None)
            if (
                field.name in READ_FIELDS
                or field.name in found
                or field.name.startswith("_")
                or not isinstance(value, torch.Tensor)
                or value.ndim < 2
            ):
                continue
            dtype = str(value.dtype).replace("torch.", "")
            found[field.name] = f"{dtype} {tuple(value.shape)}"
    return found


def undrawn_line(undrawn: dict[str, str]) -> str:
    """One line saying which fields :func:`preview` could not draw (:func:`undrawn_fields`)."""
    fields = ", ".join(f"{name} ({kind})" for name, kind in undrawn.items())
    return (
        f"preview: cannot draw field(s) {fields}: no drawer for such tensors; "
        f"the sheet shows the documents without them"
    )


def doc_texts(encoder: Any, batch: Any) -> list[str]:
    """Each document's tokens decoded with the encoder's tokenizer."""
    flat = batch.tokens.flatten()
    return [
        encoder.tokenizer.decode(
            flat[int(batch.cu_seqlens[j]) : int(batch.cu_seqlens[j]) + int(batch.doc_lengths[j])]
        )
        for j in range(len(batch.keys))
    ]


def _normalize_of(encoder: Any, modality: str | None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The (mean, std) of the last ``Normalize`` of the encoder's image/frame pipeline, if any."""
    if modality is not None and isinstance(encoder, MultimodalTaskEncoder):
        encoder = encoder.encoders.get(modality, encoder)
    if not isinstance(encoder, ImageTextTaskEncoder | VideoTextTaskEncoder):
        return None
    steps = [t for t in getattr(encoder.pipeline, "transforms", []) if isinstance(t, v2.Normalize)]
    if not steps:
        return None
    return torch.tensor(steps[-1].mean).view(-1, 1, 1), torch.tensor(steps[-1].std).view(-1, 1, 1)


def _to_pil(image: torch.Tensor, norm) -> Any:
    """float ``(C, h, w)`` → an RGB picture ``TILE`` pixels high: the pipeline's Normalize undone
    when known, else stretched from its own min..max."""
    x = image.detach().float().cpu()
    if norm is not None and x.shape[0] == norm[0].shape[0]:
        x = x * norm[1] + norm[0]
    else:
        lo, hi = float(x.min()), float(x.max())
        x = (x - lo) / (hi - lo) if hi > lo else torch.zeros_like(x)
    if x.shape[0] == 1:
        x = x.expand(3, -1, -1)
    arr = (x.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).contiguous().numpy()
    pic = Image.fromarray(arr[:, :, :3], "RGB")
    return pic.resize(
        (max(1, round(pic.width * TILE / pic.height)), TILE), Image.Resampling.NEAREST
    )


def _mel_to_pil(mel: torch.Tensor, width: int) -> Any:
    """log-mel ``(n_mels, T)`` → a viridis picture, low frequencies at the bottom, ``TILE`` high."""
    x = mel.detach().float().cpu().numpy()[::-1]
    lo, hi = float(np.percentile(x, 2)), float(np.percentile(x, 98))
    x = np.clip((x - lo) / (hi - lo), 0, 1) if hi > lo else np.zeros_like(x)
    rgb = (colormaps["viridis"](x)[:, :, :3] * 255).astype(np.uint8)
    return Image.fromarray(rgb, "RGB").resize(
        (max(1, min(width, x.shape[1] * 4)), TILE), Image.Resampling.BILINEAR
    )


#: Views of a point cloud on the sheet: (name, horizontal axis, vertical axis, depth axis), y up.
POINT_VIEWS = (("front", 0, 1, 2), ("side", 2, 1, 0), ("top", 0, 2, 1))


def _points_to_pil(points: torch.Tensor, view: tuple[str, int, int, int]) -> Any:
    """A cloud ``(P, 3|6)`` drawn orthographically, ``TILE`` square: points far away first, near
    ones over them; coloured by their rgb channels (``(P, 6)``), else by depth."""
    _, h_axis, v_axis, d_axis = view
    p = points.detach().float().cpu().numpy()
    xyz = p[:, :3]
    extent = float(np.abs(xyz).max()) or 1.0
    u = np.clip(
        ((xyz[:, h_axis] / extent + 1) / 2 * (TILE - 3)).round().astype(int) + 1, 0, TILE - 2
    )
    v = np.clip(
        ((1 - (xyz[:, v_axis] / extent + 1) / 2) * (TILE - 3)).round().astype(int) + 1, 0, TILE - 2
    )
    depth = xyz[:, d_axis]
    if p.shape[1] >= 6:
        rgb = (np.clip(p[:, 3:6], 0, 1) * 255).astype(np.uint8)
    else:
        rgb = (
            colormaps["viridis"]((depth - depth.min()) / (np.ptp(depth) or 1.0))[:, :3] * 255
        ).astype(np.uint8)
    img = np.full((TILE, TILE, 3), 255, dtype=np.uint8)
    for i in np.argsort(depth, kind="stable"):  # the viewer is on the depth axis' positive side
        img[v[i] : v[i] + 2, u[i] : u[i] + 2] = rgb[i]
    return Image.fromarray(img, "RGB")


def _wrap(text: str, font: Any, width: int, max_lines: int) -> list[str]:
    lines, line = [], ""
    for word in text.split():
        trial = f"{line} {word}".strip()
        if font.getlength(trial) <= width:
            line = trial
            continue
        if line:
            lines.append(line)
        line = word
        if len(lines) == max_lines:
            break
    if line and len(lines) < max_lines:
        lines.append(line)
    return lines


def contact_sheet(encoder: Any, batches: list[Any], n: int = 16, title: str = "") -> Any:
    """A PIL picture of the first ``n`` documents of ``batches``, one row each: its media (images,
    tiles, up to `MAX_TILES` frames of a clip in a row, a mel spectrogram) on the left, its
    key, modality and decoded text on the right."""
    font = ImageFont.load_default(size=13)
    small = ImageFont.load_default(size=11)
    rows = []
    for batch in batches:
        modalities = getattr(batch, "modalities", None) or [type(encoder).name] * len(batch.keys)
        for key, modality, media, text in zip(
            batch.keys, modalities, doc_media(batch), doc_texts(encoder, batch)
        ):
            norm = _normalize_of(encoder, modality)
            pics = []
            for kind, tensor in media:
                if kind == "image":
                    pics.append(_to_pil(tensor, norm))
                elif kind == "points":
                    pics += [_points_to_pil(tensor, view) for view in POINT_VIEWS]
                elif kind in ("tiles", "video"):
                    step = max(1, -(-tensor.shape[0] // MAX_TILES))
                    pics += [_to_pil(frame, norm) for frame in tensor[::step]]
                else:
                    pics.append(_mel_to_pil(tensor, MAX_TILES * (TILE + 2)))
            label = (
                f"{key}  [{modality}" + "".join(f", {k} {tuple(t.shape)}" for k, t in media) + "]"
            )
            rows.append((pics, label, text))
            if len(rows) == n:
                break
        if len(rows) == n:
            break
    media_width = max([sum(p.width + 2 for p in pics) for pics, _, _ in rows] + [TILE])
    width = PAD + media_width + PAD + TEXT_WIDTH + PAD
    head = 24 if title else 0
    height = head + PAD + len(rows) * (TILE + PAD)
    sheet = Image.new("RGB", (width, height), (250, 250, 248))
    draw = ImageDraw.Draw(sheet)
    if title:
        draw.text((PAD, 5), title, fill=(0, 0, 0), font=font)
    y = head + PAD
    for pics, label, text in rows:
        x = PAD
        for pic in pics:
            sheet.paste(pic, (x, y))
            x += pic.width + 2
        tx = PAD + media_width + PAD
        draw.text((tx, y), label[:70], fill=(90, 90, 90), font=small)
        for i, line in enumerate(_wrap(text, font, TEXT_WIDTH, 5)):
            draw.text((tx, y + 16 + 16 * i), line, fill=(0, 0, 0), font=font)
        draw.line(
            [(PAD, y + TILE + PAD // 2), (width - PAD, y + TILE + PAD // 2)], fill=(220, 220, 220)
        )
        y += TILE + PAD
    return sheet


def _dataset_sample_class(path: Path) -> str | None:

    try:
        doc = yaml.safe_load((path / ".nv-meta" / "dataset.yaml").read_text())
        return doc["sample_type"]["__class__"]
    except (OSError, KeyError, TypeError, yaml.YAMLError):
        return None


def preview_config(target: str | Path, encoder: Any = None, n: int = 16) -> Any:
    """The run config ``preview`` draws from: ``target`` is a run config (``data`` + ``encoder``,
    blends included) or a dataset folder / metadataset YAML, then encoded with ``encoder`` (a
    config path, dict or name; default: `DEFAULT_ENCODERS` of the dataset's sample class).
    Loader: the run config's, with no workers; a dataset gets one batch of ``n`` samples."""
    if is_remote(target):  # a dataset on object storage (a config is a local file)
        check_there(str(target))
        return _dataset_config(str(target), encoder, n, dataset_root(str(target)))
    path = Path(target)
    doc = None
    if path.is_file() and path.suffix in (".yaml", ".yml"):
        doc = yaml.safe_load(path.read_text())
    if isinstance(doc, dict) and "data" in doc and "encoder" in doc:
        overrides = {"loader.num_workers": 0}
        if encoder is not None:
            overrides["encoder"] = encoder
        return load_config(path, overrides)

    if path.is_file() and path.suffix not in (".yaml", ".yml"):
        raise DatasetError(
            f"{path}: a file that is neither a run config nor a metadataset (YAML); pass a run "
            f"config, a dataset folder or a metadataset YAML"
        )
    if encoder is None and path.is_dir() and not (path / ".nv-meta" / "dataset.yaml").is_file():
        raise DatasetError(
            f"{path}: not an Energon dataset (no .nv-meta/dataset.yaml) nor a run config; "
            f"convert it with `energon-platform convert ...` first"
        )
    return _dataset_config(str(path.resolve()), encoder, n, path if path.is_dir() else None)


def _dataset_config(data: str, encoder: Any, n: int, folder: Any) -> Any:
    """The run config of a dataset or metadataset ``data`` (a local path or an ``msc://`` URL):
    ``encoder``, or the default of the sample class read from ``folder`` (a ``Path`` or
    ``EPath``; None for a metadataset); one global batch of ``n`` samples, no workers. An
    encoder that packs gets them as one pack group (a global batch of one group of ``n``
    samples, at least 2), not ``n`` groups of its whole packing buffer each."""
    if encoder is None:
        sample_class = _dataset_sample_class(folder) if folder is not None else None
        if sample_class not in DEFAULT_ENCODERS:
            what = (
                f"sample type {sample_class or 'unknown'}"
                if folder is not None
                else "a metadataset: its datasets may hold different sample types"
            )
            raise ConfigError(
                data,
                "--encoder",
                f"cannot choose an encoder for {data} ({what}); pass "
                f"--encoder CONFIG (e.g. configs/encoders/multimodal.yaml)",
            )
        encoder = DEFAULT_ENCODERS[sample_class]
    config = {
        "data": {"path": data, "val_split": None},
        "encoder": encoder,
        "loader": {"global_batch_size": n, "num_workers": 0},
    }
    cfg = load_config(config)
    if getattr(build_encoder(cfg), "packing_buffer_size", None):
        config["loader"] = {"global_batch_size": 1, "pack_group": max(2, n), "num_workers": 0}
        cfg = load_config(config)
    return cfg


def _too_few_for_n(cfg: Any, n: int, error: PlanError) -> bool:
    """Whether ``error`` says that a dataset has fewer samples than ``--n`` asks of one global
    batch: the sheet's own config (a dataset's, not a run config's) whose global batch is the
    ``n`` samples, and a dataset smaller than ``n`` named. Anything else keeps its own words."""
    per_batch = cfg.loader.global_batch_size * (cfg.loader.pack_group or 1)
    return (
        cfg.source == "<dict>"
        and per_batch == n
        and error.smallest is not None
        and error.smallest < n
    )


#: Picture formats a sheet is written in, by the suffix of ``--out``.
SHEET_FORMATS = {
    ".png": "PNG",
    ".jpg": "JPEG",
    ".jpeg": "JPEG",
    ".webp": "WEBP",
    ".bmp": "BMP",
    ".tif": "TIFF",
    ".tiff": "TIFF",
}


def sheet_format(out: str | Path) -> str:
    """The Pillow format ``out``'s suffix names (`SHEET_FORMATS`, any case);
    `ConfigError` naming ``--out`` for another suffix or none."""
    suffix = Path(out).suffix.lower()
    if suffix not in SHEET_FORMATS:
        raise ConfigError(
            str(out),
            "--out",
            f"no picture format is named by the suffix {suffix or '(none)'!r}; "
            f"end the name with one of {', '.join(SHEET_FORMATS)}",
        )
    return SHEET_FORMATS[suffix]


#: The mark a contact sheet carries in its metadata (PNG text, JPEG comment, WebP XMP, TIFF
#: description): the only existing picture ``preview --out`` replaces. BMP holds no metadata, so
#: an existing ``.bmp`` is never replaced.
MARK = "energon-platform preview contact sheet"


def _marked(fmt: str) -> dict:
    """Pillow ``save`` arguments that write `MARK` into a picture of format ``fmt``."""
    if fmt == "PNG":
        info = PngImagePlugin.PngInfo()
        info.add_text("Software", MARK)
        return {"pnginfo": info}
    if fmt == "JPEG":
        return {"comment": MARK.encode()}
    if fmt == "WEBP":
        return {"xmp": MARK.encode()}
    if fmt == "TIFF":
        return {"description": MARK}
    return {}


def is_sheet(path: Path) -> bool:
    """Whether the picture ``path`` carries `MARK` (a contact sheet ``preview`` wrote)."""
    try:
        with Image.open(path) as image:
            found = [image.info.get(k) for k in ("Software", "comment", "xmp")]
            if isinstance(image, TiffImagePlugin.TiffImageFile):  # its description tag
                found.append(image.tag_v2.get(270))
    except Exception:  # not a picture Pillow reads: not ours
        return False
    return any(v in (MARK, MARK.encode()) for v in found)


def preview(target: str | Path, out: str | Path, n: int = 16, encoder: Any = None) -> dict:
    """Encode the first training samples of ``target`` (`preview_config`) with
    energon_platform's train loader (epoch 0, training augmentation, per-sample seeds) and write
    their `contact_sheet` to ``out`` in the format its suffix names (`sheet_format`).
    ``FileNotFoundError`` naming ``target`` when it does not exist, checked first, then the format.
    Returns ``{"path", "width", "height", "documents", "undrawn"}``; ``undrawn``: the batch fields
    the sheet has no drawer for (:func:`undrawn_fields`; the CLI says them on stderr)."""
    if not is_remote(target) and not Path(target).exists():
        raise FileNotFoundError(f"{target}: no such run config, dataset or metadataset")
    fmt = sheet_format(out)
    check_file(
        out,
        is_sheet,
        "contact sheet",
        inputs=[target, encoder if isinstance(encoder, (str, Path)) else None],
    )
    cfg = preview_config(target, encoder, n)
    try:
        loader = TrainLoader(cfg)
    except PlanError as e:  # one global batch of n documents holds each sample once at most
        if not _too_few_for_n(cfg, n, e):
            raise  # another cause (a run config's own blend and batch size): its own words
        raise ConfigError(
            str(target),
            "--n",
            f"{n} documents, but a dataset has {e.smallest} samples; a sheet is one global batch "
            f"and shows each sample once at most: pass --n {e.smallest} or fewer",
        ) from None
    try:
        batches, docs = [], 0
        while docs < n:
            batch = next(loader)
            batches.append(batch)
            docs += len(batch.keys)
            if len(batches) > 4 * n:
                break
        title = (
            f"{Path(target).name}: {type(loader.encoder).__name__} "
            f"({type(loader.encoder).name}), training samples, epoch 0"
        )
        sheet = contact_sheet(loader.encoder, batches, n, title)
        undrawn = undrawn_fields(batches)
    finally:
        loader.close()
    out = Path(out)
    try:
        with write_atomic(out) as tmp:
            sheet.save(tmp, format=fmt, **_marked(fmt))
    except OSError as e:  # a full disk, a quota: write_atomic left ``out`` as it was
        raise OutputError(
            f"--out {out}: cannot write the contact sheet ({e.strerror or e}); nothing was "
            f"written there; free space, or choose another --out"
        ) from None
    return {
        "path": str(out),
        "width": sheet.width,
        "height": sheet.height,
        "documents": min(n, docs),
        "undrawn": undrawn,
    }
