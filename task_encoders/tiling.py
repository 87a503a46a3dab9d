"""Vision-encoder geometry and dynamic-resolution tiling, as Megatron-LM's multimodal example does it.

Two config sections (read by `task_encoders.image_text` and `task_encoders.conversation`):

* ``vision:`` (`VisionConfig`): what the language model sees of one image tile, i.e. the
  numbers Megatron-LM gets as ``--vision-model-type``, ``--img-h``/``--img-w``, ``--patch-dim``,
  ``--disable-vision-class-token`` and ``--pixel-shuffle``. `VisionConfig.embeddings_per_tile`
  is megatron-core's ``get_num_image_embeddings`` for those values (tile tags are not supported):
  ``(img_h // patch_dim) * (img_w // patch_dim)`` patches, plus ``class_token_len`` unless the class
  token is dropped (SigLIP has none), divided by 4 with pixel shuffle.
* ``image.tiling:`` (`TilingConfig`): Megatron's ``--use-tiling``, ``--max-num-tiles``,
  ``--use-thumbnail`` and ``--use-area-weighted-aspect-ratio``. The tile side is the vision
  encoder's image size (``vision.image_size``, Megatron's ``--img-h``); it is never configured twice.

`tile_image` is the InternVL-style dynamic preprocessing of Megatron's
``examples/multimodal/image_processing.py``: among the grids ``cols x rows`` with
``min_num_tiles <= cols * rows <= max_num_tiles`` it picks the one whose aspect ratio is closest to
the image's (ties: the later, larger grid when the image covers more than half of it), resizes the
image to ``cols * tile`` by ``rows * tile`` pixels (bicubic, antialiased), cuts the tiles row by row,
left to right, and, with ``use_thumbnail`` and more than one tile, appends the whole image resized to
one tile. Candidate grids are visited by tile count, then columns, then rows (Megatron sorts a set by
tile count only, so its order among grids of equal count is the set's; the choice differs only when
two different aspect ratios are exactly equally close). Tiling draws no random numbers: the seeded
augmentation runs on the whole image before it (`task_encoders.image_text`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torchvision.transforms import InterpolationMode
from torchvision.transforms.v2 import functional as F

from task_encoders.config_parser import At, require

#: Largest ``max_num_tiles`` accepted (Megatron's tile tags stop at 12; NVLM uses up to 12).
MAX_TILES = 40
_INTERPOLATION = {"bilinear": InterpolationMode.BILINEAR, "bicubic": InterpolationMode.BICUBIC}


@dataclass(frozen=True)
class VisionConfig:
    """``vision:``: the vision encoder the batches are for (Megatron-LM's arguments in brackets).

    ``image_size``, when set, is a multiple of ``patch_dim``, at most 4096.
    """

    model_type: Literal["clip", "siglip", "internvit"] = "clip"
    """The vision encoder (``--vision-model-type``); ``siglip`` has no class token."""
    image_size: int | None = None
    """The tile side in pixels (``--img-h`` = ``--img-w``); null: the image pipeline's output
    size (only without tiling)."""
    patch_dim: int = 14
    """The ViT patch side in pixels (``--patch-dim``), 1 to 512."""
    class_token_len: int = 1
    """Class tokens the ViT adds (megatron-core's CLIP ViT: 1), 0 to 64."""
    drop_class_token: bool = False
    """Leave the class tokens out of the image embeddings (``--disable-vision-class-token``)."""
    pixel_shuffle: bool = False
    """A quarter of the embeddings per tile (``--pixel-shuffle``)."""

    def check(self, at: At) -> None:
        require(
            1 <= self.patch_dim <= 512,
            at.child("patch_dim"),
            f"got {self.patch_dim}",
            "an integer from 1 to 512",
        )
        if self.image_size is not None:
            require(
                self.patch_dim <= self.image_size <= 4096 and self.image_size % self.patch_dim == 0,
                at.child("image_size"),
                f"{self.image_size} with patch_dim {self.patch_dim}",
                "a multiple of vision.patch_dim, at most 4096",
            )
        require(
            0 <= self.class_token_len <= 64,
            at.child("class_token_len"),
            f"got {self.class_token_len}",
            "an integer from 0 to 64",
        )

    def embeddings_per_tile(self, image_size: int) -> int:
        """Image embeddings the language model gets per tile of ``image_size`` pixels a side
        (megatron-core's ``get_num_image_embeddings`` without tile tags)."""
        keep_class = self.model_type != "siglip" and not self.drop_class_token
        patches = (image_size // self.patch_dim) ** 2
        count = patches + (self.class_token_len if keep_class else 0)
        return int(count * 0.25) if self.pixel_shuffle else count


@dataclass(frozen=True)
class TilingConfig:
    """``image.tiling:``: dynamic-resolution tiles (module doc; Megatron-LM's arguments in
    brackets). ``1 <= min_num_tiles <= max_num_tiles <= MAX_TILES``."""

    enabled: bool = False
    """Cut every image into tiles of ``vision.image_size`` (``--use-tiling``)."""
    max_num_tiles: int = 6
    """The most tiles of one image, the thumbnail not counted (``--max-num-tiles``)."""
    min_num_tiles: int = 1
    """The fewest tiles of one image."""
    use_thumbnail: bool = False
    """Append the whole image as one more tile when it has several (``--use-thumbnail``)."""
    aspect_ratio: Literal["closest", "area_weighted"] = "closest"
    """How the tile grid is chosen: the closest aspect ratio, or area weighted
    (``--use-area-weighted-aspect-ratio``)."""
    interpolation: Literal["bilinear", "bicubic"] = "bicubic"
    """The resize to the tile grid."""

    def check(self, at: At) -> None:
        require(
            1 <= self.max_num_tiles <= MAX_TILES,
            at.child("max_num_tiles"),
            f"got {self.max_num_tiles}",
            f"an integer from 1 to {MAX_TILES}",
        )
        require(
            1 <= self.min_num_tiles <= self.max_num_tiles,
            at.child("min_num_tiles"),
            f"got {self.min_num_tiles} with max_num_tiles {self.max_num_tiles}",
            "1 <= min_num_tiles <= max_num_tiles",
        )

    @property
    def most_tiles(self) -> int:
        """The most tiles one image can become (the thumbnail included)."""
        return self.max_num_tiles + (1 if self.use_thumbnail and self.max_num_tiles > 1 else 0)


def candidate_grids(min_tiles: int, max_tiles: int) -> list[tuple[int, int]]:
    """``(cols, rows)`` with ``min_tiles <= cols * rows <= max_tiles``, by tile count, cols, rows."""
    grids = {
        (c, r)
        for c in range(1, max_tiles + 1)
        for r in range(1, max_tiles + 1)
        if min_tiles <= c * r <= max_tiles
    }
    return sorted(grids, key=lambda g: (g[0] * g[1], g[0], g[1]))


def choose_grid(width: int, height: int, tile: int, cfg: TilingConfig) -> tuple[int, int]:
    """The ``(cols, rows)`` grid for an image of ``width`` x ``height`` pixels (module doc)."""
    aspect = width / height
    area = width * height
    best, best_score = (1, 1), None
    for cols, rows in candidate_grids(cfg.min_num_tiles, cfg.max_num_tiles):
        ratio = cols / rows
        if cfg.aspect_ratio == "area_weighted":
            score = min(cols * rows * tile * tile / area, 0.6) * min(ratio / aspect, aspect / ratio)
            if best_score is None or score > best_score:
                best, best_score = (cols, rows), score
        else:
            diff = abs(aspect - ratio)
            if best_score is None or diff < best_score:
                best, best_score = (cols, rows), diff
            elif diff == best_score and area > 0.5 * tile * tile * cols * rows:
                best = (cols, rows)
    return best


def _thumbnail(cfg: TilingConfig, grid_tiles: int) -> bool:
    """Whether a thumbnail follows a grid of ``grid_tiles`` tiles."""
    return cfg.use_thumbnail and grid_tiles > 1


def tile_count(width: int, height: int, tile: int, cfg: TilingConfig) -> int:
    """How many tiles `tile_image` makes of an image of ``width`` x ``height`` pixels (no pixels
    needed: the grid depends on the size only)."""
    cols, rows = choose_grid(width, height, tile, cfg)
    return cols * rows + int(_thumbnail(cfg, cols * rows))


def tile_image(
    image: torch.Tensor, tile: int, cfg: TilingConfig, grid: tuple[int, int] | None = None
) -> torch.Tensor:
    """float ``(C, H, W)`` → float32 ``(T, C, tile, tile)``: the grid's tiles row by row, then the
    thumbnail (module doc). Deterministic. ``grid``: ``(cols, rows)`` when ``image`` is already
    resized to it (``image.uint8_resize``: `grid_size` chose it on the original size)."""
    _, height, width = image.shape
    cols, rows = grid or choose_grid(width, height, tile, cfg)
    mode = _INTERPOLATION[cfg.interpolation]
    resized = (
        image
        if (height, width) == (rows * tile, cols * tile)
        else F.resize(image, [rows * tile, cols * tile], interpolation=mode, antialias=True)
    )
    tiles = [
        resized[:, r * tile : (r + 1) * tile, c * tile : (c + 1) * tile]
        for r in range(rows)
        for c in range(cols)
    ]
    if _thumbnail(cfg, len(tiles)):
        tiles.append(F.resize(image, [tile, tile], interpolation=mode, antialias=True))
    return torch.stack(tiles).to(torch.float32).contiguous()
