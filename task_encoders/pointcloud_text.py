"""Mesh or point cloud + caption → a seeded point cloud + caption tokens (``encoder: pointcloud_text``).

Input: `converters.sample_types.PointCloudTextSample` (``geometry``: the stored file's bytes,
or the array Energon decoded an ``.npy`` part into; ``text``; ``meta``: the converter's
``text.json``, whose ``source.format`` names the format).

Per sample (every draw from numpy generators seeded by (run seed, key, epoch), so the points are
a pure function of those three, whatever the worker count or process):

1. **Points** (stream ``"points"``): ``pointcloud.num_points`` points on a mesh's surface, faces
   picked with probability proportional to their area (`converters.mesh3d.sample_surface`,
   trimesh's sampler), colours interpolated from the vertices'; a stored cloud gives a draw of its
   points (without replacement when it has enough).
2. **Normalisation**: centred on the points' mean, scaled so the farthest point is at distance 1.
3. **Augmentation** (training only, stream ``"augment"``): a rotation about the up axis
   (``rotation: up``, ``up_axis``) or a uniform random rotation (``so3``); a uniform scale in
   ``scale``; Gaussian jitter of ``jitter`` standard deviation clipped to ``jitter_clip``; point
   dropout of up to ``dropout`` of the points (a dropped point is replaced by the first point, so
   the shape stays ``(N, C)``, as PointNet++ does).
4. **Colours** (``colors: true``): rgb in [0, 1] as channels 3..5; a file without colours gives
   zeros there and ``has_colors`` False.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from megatron.energon import edataclass

from converters.mesh3d import Geometry, load, sample_surface, sniff
from task_encoders.batch_fields import PointFields
from task_encoders.batch_tensors import Medium
from task_encoders.config import EncoderConfig
from task_encoders.config_parser import At, require
from task_encoders.documents import DocumentTaskEncoder, EncodedDoc, TextBatch
from task_encoders.features import features
from task_encoders.image_path import ImageBytesDecoder
from task_encoders.registry import register

_AXES = {"x": 0, "y": 1, "z": 2}


@dataclass(frozen=True)
class PointCloudConfig:
    """``pointcloud:`` section (module doc): sampling, then augmentation in training."""

    num_points: int = 1024
    """Points per cloud (1 to 1000000)."""
    colors: bool = False
    """Add rgb channels in [0, 1] (zeros for a file without colours)."""
    rotation: Literal["none", "up", "so3"] = "up"
    """The training rotation: none, about ``up_axis``, or uniform over all rotations (``so3``)."""
    up_axis: Literal["x", "y", "z"] = "y"
    """The axis ``rotation: up`` turns about."""
    scale: tuple[float, float] = (0.8, 1.25)
    """[low, high] of the uniform scale factor drawn in training (0 < low <= high)."""
    jitter: float = 0.01
    """Standard deviation of the Gaussian noise added to every coordinate in training (>= 0)."""
    jitter_clip: float = 0.05
    """The noise is clipped to [-jitter_clip, jitter_clip] (>= 0)."""
    dropout: float = 0.0
    """The largest share of points dropped in training, in [0, 1) (the share is drawn per
    sample)."""

    def check(self, at: At) -> None:
        require(
            1 <= self.num_points <= 1_000_000,
            at.child("num_points"),
            f"got {self.num_points}",
            "an integer from 1 to 1000000",
        )
        require(
            0 < self.scale[0] <= self.scale[1],
            at.child("scale"),
            f"got {list(self.scale)}",
            "[low, high] with 0 < low <= high",
        )
        require(
            self.jitter >= 0 and self.jitter_clip >= 0,
            at.child("jitter"),
            f"got {self.jitter}/{self.jitter_clip}",
            "jitter and jitter_clip >= 0",
        )
        require(
            0 <= self.dropout < 1,
            at.child("dropout"),
            f"got {self.dropout}",
            "a fraction in [0, 1)",
        )

    @property
    def channels(self) -> int:
        return 6 if self.colors else 3


@dataclass(frozen=True)
class PointCloudTextConfig(EncoderConfig):
    """Top level of a ``pointcloud_text`` config: the shared sections plus ``pointcloud``."""

    encoder: str = "pointcloud_text"
    """The registered name of the encoder: ``pointcloud_text``."""
    pointcloud: PointCloudConfig = field(default_factory=PointCloudConfig)
    """Point sampling and augmentation (the ``pointcloud`` keys below)."""


@edataclass
class PointCloudTextBatch(TextBatch):
    """`task_encoders.documents.TextBatch` plus, per document (``D == N`` without packing):

    * ``points``: float32 ``(D, P, C)``, ``P = pointcloud.num_points``, ``C`` = 3 (xyz) or 6 (xyz,
      rgb in [0, 1]) with ``pointcloud.colors``; xyz normalised to the unit sphere, then augmented.
    * ``has_colors``: bool ``(D,)``, whether the file had colours (False: rgb channels are zero).
    """

    media = (Medium("points"),)
    #: a flag beside ``points``, whose rgb channels (zero without colours) are digested
    undigested = TextBatch.undigested + ("has_colors",)

    points: torch.Tensor
    has_colors: torch.Tensor


def geometry_of(sample: Any) -> Geometry:
    """The sample's geometry (`converters.mesh3d.load`), its format from ``meta`` or its content."""
    data = sample.geometry
    if isinstance(data, np.ndarray):
        return load(data, "npy")
    data = bytes(data)
    fmt = ((getattr(sample, "meta", None) or {}).get("source") or {}).get("format") or sniff(data)
    if fmt is None:
        raise ValueError(f"{len(data)} bytes in no known 3D format")
    return load(data, fmt)


def normalise(points: np.ndarray) -> np.ndarray:
    """Centred on the mean, the farthest point at distance 1; ``ValueError`` when all points are equal."""
    centred = points - points.mean(axis=0)
    radius = float(np.sqrt((centred**2).sum(axis=1).max()))
    if not radius > 0:
        raise ValueError("every sampled point is the same (degenerate geometry)")
    return centred / radius


def rotation_matrix(cfg: PointCloudConfig, rng: np.random.Generator) -> np.ndarray:
    """float64 ``(3, 3)``: identity, a turn about the up axis, or a uniform rotation (QR of a
    Gaussian matrix with the signs fixed)."""
    if cfg.rotation == "none":
        return np.eye(3)
    if cfg.rotation == "up":
        angle = rng.uniform(0.0, 2 * np.pi)
        c, s = np.cos(angle), np.sin(angle)
        a, b = [i for i in range(3) if i != _AXES[cfg.up_axis]]
        m = np.eye(3)
        m[a, a], m[a, b], m[b, a], m[b, b] = c, -s, s, c
        return m
    q, r = np.linalg.qr(rng.standard_normal((3, 3)))
    q = q * np.sign(np.diag(r))
    return q if np.linalg.det(q) > 0 else -q


def augment(
    points: np.ndarray, colors: np.ndarray | None, cfg: PointCloudConfig, rng: np.random.Generator
):
    """Module doc, step 3: rotation, scale, jitter, dropout (in this order, every draw from ``rng``)."""
    points = points @ rotation_matrix(cfg, rng).T
    points = points * rng.uniform(cfg.scale[0], cfg.scale[1])
    if cfg.jitter > 0:
        points = points + np.clip(
            rng.normal(0.0, cfg.jitter, points.shape), -cfg.jitter_clip, cfg.jitter_clip
        )
    if cfg.dropout > 0:
        dropped = rng.random(len(points)) < rng.uniform(0.0, cfg.dropout)
        points[dropped] = points[0]
        if colors is not None:
            colors = colors.copy()
            colors[dropped] = colors[0]
    return points, colors


@register("pointcloud_text")
class PointCloudTextTaskEncoder(DocumentTaskEncoder):
    """``PointCloudTextTaskEncoder(config=None, *, seed=None, training=True)``; batches are
    `PointCloudTextBatch`. ``training=False``: the same seeded points, no augmentation."""

    config_class = PointCloudTextConfig
    config: PointCloudTextConfig
    #: images, which this encoder never reads, stay undecoded bytes
    decoder = ImageBytesDecoder()
    batch_type = PointCloudTextBatch

    def cloud(self, sample: Any) -> tuple[np.ndarray, np.ndarray | None]:
        """float64 ``(P, 3)`` points after steps 1-3 and uint8 ``(P, 3)`` colours (or None)."""
        cfg = self.config.pointcloud
        geom = geometry_of(sample)
        points, colors = sample_surface(
            geom, cfg.num_points, np.random.default_rng(self.sample_seed(sample, "points"))
        )
        points = normalise(points)
        if self.training:
            points, colors = augment(
                points, colors, cfg, np.random.default_rng(self.sample_seed(sample, "augment"))
            )
        return points, colors

    def encode_media(self, sample: Any) -> dict[str, torch.Tensor]:
        points, colors = self.cloud(sample)
        cfg = self.config.pointcloud
        out = np.zeros((len(points), cfg.channels), dtype=np.float32)
        out[:, :3] = points
        if cfg.colors and colors is not None:
            out[:, 3:] = colors / np.float32(255.0)
        return {"points": torch.from_numpy(out), "has_colors": torch.tensor(colors is not None)}

    def collate_media(self, docs: list[EncodedDoc]) -> dict[str, Any]:
        return {
            "points": torch.stack([d.media["points"] for d in docs]),
            "has_colors": torch.stack([d.media["has_colors"] for d in docs]),
        }

    # --- lengths without decoding (DocumentTaskEncoder's contract): work adds the cloud's points ---

    facts_width = 2

    def sample_facts(self, sample: Any) -> tuple[int, ...]:
        """``(caption tokens, vertices or points in the file)``: the count from the converter's
        ``text.json`` when there, else by parsing the file; ``ValueError`` for a file without any."""
        source = (getattr(sample, "meta", None) or {}).get("source") or {}
        count = source.get("vertices")
        if not isinstance(count, int):
            count = len(geometry_of(sample).vertices)
        if count < 1:
            raise ValueError("no vertex or point in the 3D file")
        return (*super().sample_facts(sample), count)

    def sample_length(self, facts: tuple[int, ...], key: str, epoch: int) -> tuple[int, int]:
        row, _ = super().sample_length(facts[:1], key, epoch)
        return row, row + self.config.pointcloud.num_points

    def encoded_length(self, doc: EncodedDoc) -> tuple[int, int]:
        row, _ = super().encoded_length(doc)
        return row, row + int(doc.media["points"].shape[0])

    # --- cost features: the work outside the row is the cloud's points ---------------------------

    work_feature = "points"

    def batch_media_features(self, batch: PointFields) -> dict[str, float]:
        """Every cloud has ``points.shape[1]`` points (a dropped point is replaced, not removed)."""
        return features(points=batch.points.shape[0] * batch.points.shape[1])
