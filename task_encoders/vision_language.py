"""Image-caption pairs → vision-language batches (``encoder: image_text`` with ``prompt.enabled``).

`VisionLanguageTaskEncoder` is what `task_encoders.registry` builds for an
``image_text`` config with ``prompt.enabled: true`` (opt-in; what megatron-core's ``LLaVAModel``
needs). The config is `task_encoders.image_text.ImageTextConfig`; the conversation encoder
(`task_encoders.conversation`) extends this class.

* **Text from a prompt template.** A document is ``[BOS] + prompt + caption + [EOS]`` where the
  prompt is ``prompt.template`` with ``{image}`` replaced by ``prompt.image_token`` (``<image>``,
  one placeholder per image) and ``{instruction}`` by one of ``prompt.instructions``, chosen with
  the sample's own generator (stream ``"prompt"``). The default gives ``"<image>\\n" + instruction +
  "\\n" + caption``. The loss covers the answer only: ``loss_mask`` is 1 exactly where ``labels``
  is a caption token or the final EOS.
* **The placeholder is a special token** (``prompt.special_tokens``, Megatron's
  ``--special-tokens``, added to the tokenizer as Megatron adds them,
  `task_encoders.tokenization.TextTokenizer.add_special_tokens`); its id is
  `VisionLanguageTaskEncoder.image_token_index` and every batch's ``image_token_index``.
* **Tiles** (``image.tiling``, `task_encoders.tiling`): each image is augmented whole (the
  ``image.transforms`` then may only hold ``RandomHorizontalFlip``, ``ColorJitter`` and
  ``Normalize``; the seeded draws happen here) and cut into ``num_tiles`` tiles of
  ``vision.image_size``; without tiling every image is one tile of the pipeline's output size.
* **Lengths the language model sees.** A document's length is its *spliced* length, Megatron's
  ``total_len``: ``tokens + num_tiles * E - num_images`` with ``E`` =
  `VisionLanguageTaskEncoder.tokens_per_tile` (``vision``). ``text.seq_len`` bounds that
  length (captions are cut to fit, EOS kept; a document whose prompt and images alone do not fit is
  skipped), and packing fills rows up to ``text.seq_len`` spliced positions, so a packed row never
  overflows after the image embeddings are put in. Token rows keep ``text.seq_len`` columns (a row
  with images uses fewer of them; the rest is padding).
* Batches are `VisionLanguageBatch`: every image's tiles stacked in document order,
  ``num_tiles`` per image, ``num_images`` and ``spliced_lengths`` per document.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from megatron.energon import edataclass

from task_encoders.batch_fields import ImageFields, SplicedFields
from task_encoders.batch_tensors import Medium
from task_encoders.documents import EncodedDoc, Pack, TextBatch, length_probe
from task_encoders.features import features
from task_encoders.image_path import open_image
from task_encoders.image_text import ImageTextTaskEncoder, image_size
from task_encoders.registry import register_variant
from task_encoders.seeding import sample_key, seeded_global_torch
from task_encoders.sequences import first_fit_decreasing
from task_encoders.tiling import choose_grid, tile_count, tile_image


@edataclass
class VisionLanguageBatch(TextBatch):
    """A vision-language batch (module doc): `task_encoders.documents.TextBatch` (``loss_mask``
    1 on answer tokens only) plus

    * ``images``: float32 ``(T, C, t, t)``, every tile of every image, images in document order and
      each image's tiles together (megatron-core's ``imgs``); ``(0, C, t, t)`` with no image.
    * ``num_tiles``: int32 ``(I,)``, tiles per image; ``num_images``: int32 ``(D,)``, images (and
      placeholders) per document.
    * ``spliced_lengths``: int32 ``(D,)``, each document's length in the language model after the
      image embeddings replace the placeholders (``tokens + tiles * tokens_per_tile - images``).
    * ``image_token_index``: int, the placeholder's id; ``tokens_per_tile``: int, image embeddings
      per tile.
    """

    #: each image's tiles count for the document that holds the image
    media = (Medium("images", per_doc="num_images", per_item="num_tiles"),)
    #: follows from the tokens, ``num_tiles`` and ``num_images``
    undigested = TextBatch.undigested + ("spliced_lengths",)

    images: torch.Tensor
    num_tiles: torch.Tensor
    num_images: torch.Tensor
    spliced_lengths: torch.Tensor
    image_token_index: int
    tokens_per_tile: int

    @property
    def image_docs(self) -> torch.Tensor:
        """int64 ``(I,)``: the document index of each image."""
        return torch.repeat_interleave(torch.arange(len(self.num_images)), self.num_images.long())


def _prompt_enabled(config: Any) -> bool:
    return bool(config.prompt.enabled)


@register_variant("image_text", when=_prompt_enabled)
class VisionLanguageTaskEncoder(ImageTextTaskEncoder):
    """``VisionLanguageTaskEncoder(config=None, *, seed=None, training=True)``: an ``image_text``
    config with ``prompt.enabled: true`` (refuses one without); batches are
    `VisionLanguageBatch`. ``training=False`` uses ``image.eval_transforms``.

    Its `fingerprint_name` is ``"ImageTextTaskEncoder"``, the name a loader recorded for these
    configs before this class existed, so their checkpoints still resume."""

    vision_language: ClassVar[bool] = True
    fingerprint_name: ClassVar[str] = "ImageTextTaskEncoder"
    #: Rows count spliced positions, which token padding cannot make multiples of ``2N`` exactly.
    pads_segments: ClassVar[bool] = False
    batch_type = VisionLanguageBatch
    facts_width = 3  # (answer tokens, images, tiles): see sample_facts

    def __init__(self, config: Any = None, *, seed: int | None = None, training: bool = True):
        super().__init__(config, seed=seed, training=training)
        prompt = self.config.prompt
        self.special_token_ids: dict[str, int] = self.tokenizer.add_special_tokens(
            prompt.special_tokens, self.config_at.child("prompt").child("special_tokens")
        )
        self.image_token_index: int = self.special_token_ids[prompt.image_token]
        self.tile_size = self.config.tile_size
        self.tokens_per_tile = self.config.vision.embeddings_per_tile(self.tile_size)
        self._prompt_layouts: dict[tuple[int, int], tuple[int, int]] = {}

    # --- per sample ----------------------------------------------------------------------------

    def encode(self, sample: Any) -> EncodedDoc:
        images = self.sample_images(sample)
        media = self.encode_images(sample, images)
        pieces = self.text_pieces(sample, len(images))
        tokens, targets = self.fit_document(pieces, media["num_tiles"], sample)
        return EncodedDoc.derive_from(sample, tokens=tokens, media={**media, "targets": targets})

    def sample_images(self, sample: Any) -> list:
        """The sample's images, in placeholder order (a captioning sample has one)."""
        return [sample.image]

    def encode_images(self, sample: Any, images: list) -> dict[str, torch.Tensor]:
        """``{"images": (T, C, t, t), "num_tiles": int32 (I,)}``: each image augmented whole with its
        own seed (stream ``"image"``, then ``"image1"``, ...) and tiled (or one tile)."""
        tiles, counts = [], []
        tiling = self.config.image.tiling
        for i, raw in enumerate(images):
            grid = None
            if tiling.enabled and self.pipeline.uint8_resize:  # resized to the grid on uint8 first
                if isinstance(raw, (bytes, bytearray, memoryview)):
                    raw = open_image(raw)  # its header read once: for the grid, then decoded
                grid = choose_grid(*image_size(raw), self.tile_size, tiling)
                size = (grid[1] * self.tile_size, grid[0] * self.tile_size)
                raw = self.pipeline.resized(raw, size, tiling.interpolation)
            with seeded_global_torch(self.sample_seed(sample, "image" if i == 0 else f"image{i}")):
                image = self.pipeline(raw)
            image = (
                tile_image(image, self.tile_size, tiling, grid)
                if tiling.enabled
                else image[None].to(torch.float32)
            )
            tiles.append(image)
            counts.append(int(image.shape[0]))
        channels = 3 if not tiles else tiles[0].shape[1]
        stacked = (
            torch.cat(tiles)
            if tiles
            else torch.zeros((0, channels, self.tile_size, self.tile_size))
        )
        return {
            "images": stacked.contiguous(),
            "num_tiles": torch.tensor(counts, dtype=torch.int32),
        }

    def text_pieces(self, sample: Any, num_images: int) -> list[tuple[str, bool]]:
        """The document's text as ``(text, is_answer)`` pieces, without BOS/EOS."""
        instruction = (
            self.config.prompt.instructions[self.instruction_index(sample)]
            if self.config.prompt.instructions
            else ""
        )
        return [
            (self.config.prompt.user_text(instruction, num_images), False),
            (self.sample_text(sample).strip(), True),
        ]

    def instruction_index(self, sample: Any) -> int:
        """The index of the sample's instruction in ``prompt.instructions`` (its own generator, stream
        ``"prompt"``: a pure function of seed, key and epoch); 0 without instructions."""
        count = len(self.config.prompt.instructions)
        if not count:
            return 0
        return int(torch.randint(count, (1,), generator=self.sample_generator(sample, "prompt")))

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer.hf(text, add_special_tokens=False)["input_ids"] if text else []

    def document_ids(
        self, pieces: list[tuple[str, bool]], sample: Any
    ) -> tuple[list[int], list[bool]]:
        """``[BOS] + pieces`` as ids and answer flags, uncut; ``ValueError`` when an answer holds the
        image placeholder."""
        ids, targets = [self.tokenizer.special.bos], [False]
        for text, is_answer in pieces:
            piece = self._ids(text)
            if is_answer and self.image_token_index in piece:
                raise ValueError(
                    f"sample {sample_key(sample)!r}: an answer holds the image placeholder "
                    f"{self.config.prompt.image_token!r}"
                )
            ids += piece
            targets += [is_answer] * len(piece)
        return ids, targets

    def check_placeholders(self, ids: list[int], num_images: int, sample: Any) -> None:
        """``ValueError`` unless ``ids`` hold one placeholder per image."""
        found = ids.count(self.image_token_index)
        if found != num_images:
            raise ValueError(
                f"sample {sample_key(sample)!r}: {found} image placeholder(s) for {num_images} image(s)"
            )

    def extra_positions(self, num_images: int, num_tiles: int) -> int:
        """Positions the image embeddings add to a document's tokens when they replace its placeholders."""
        return num_tiles * self.tokens_per_tile - num_images

    def fitted_length(
        self, layout: tuple[int, int, int], num_images: int, num_tiles: int, key: str
    ) -> int:
        """How many of a document's ids (``[BOS] + pieces``, before EOS) survive the cut to
        ``text.seq_len`` spliced positions. ``layout``: ``(ids, end of the last placeholder, index of
        the first answer id or ids)``. ``ValueError`` (the sample is skipped and counted) when the cut
        would drop a placeholder or every answer id."""
        length, placeholder_end, first_answer = layout
        room = self.seq_len - self.extra_positions(num_images, num_tiles) - 1  # ids before EOS
        if length <= room:
            return length
        keep = max(room, 0)
        if placeholder_end > keep or first_answer >= keep:
            raise ValueError(
                f"sample {key!r}: {num_images} image(s) of {num_tiles} tile(s) x {self.tokens_per_tile} "
                f"embeddings leave no room for its answer in text.seq_len {self.seq_len}"
            )
        return keep

    @staticmethod
    def id_layout(ids: list[int], targets: list[bool], placeholder: int) -> tuple[int, int, int]:
        """``(len(ids), end of the last placeholder (0: none), first answer index (len(ids): none))``."""
        placeholder_end = max((i + 1 for i, t in enumerate(ids) if t == placeholder), default=0)
        return len(ids), placeholder_end, next((i for i, t in enumerate(targets) if t), len(ids))

    def fit_document(
        self, pieces: list[tuple[str, bool]], num_tiles: torch.Tensor, sample: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``[BOS] + pieces + [EOS]`` as int64 tokens and bool ``targets`` (answer tokens and EOS),
        cut at the end (EOS kept) so the spliced length fits ``text.seq_len`` (`fitted_length`).
        Raises ``ValueError`` (the sample is skipped and counted) when the placeholders do not match
        the images, or when the cut would drop a placeholder or every answer token."""
        ids, targets = self.document_ids(pieces, sample)
        num_images = int(num_tiles.numel())
        self.check_placeholders(ids, num_images, sample)
        keep = self.fitted_length(
            self.id_layout(ids, targets, self.image_token_index),
            num_images,
            int(num_tiles.sum()),
            sample_key(sample),
        )
        ids, targets = ids[:keep] + [self.tokenizer.special.eos], targets[:keep] + [True]
        return torch.tensor(ids, dtype=torch.int64), torch.tensor(targets, dtype=torch.bool)

    def spliced_length(self, doc: EncodedDoc) -> int:
        """The document's length in the language model (Megatron's ``total_len``)."""
        tiles = doc.media["num_tiles"]
        return int(doc.tokens.numel()) + self.extra_positions(int(tiles.numel()), int(tiles.sum()))

    # --- lengths without decoding (DocumentTaskEncoder's contract) ------------------------------

    def image_facts(self, images: list) -> tuple[int, int]:
        """``(images, tiles)`` of image parts (bytes: header only), as `encode_images` cuts them."""
        if not self.config.image.tiling.enabled:
            return len(images), len(images)
        return len(images), sum(
            tile_count(*image_size(im), self.tile_size, self.config.image.tiling) for im in images
        )

    def sample_facts(self, sample: Any) -> tuple[int, ...]:
        """``(caption tokens, images, tiles)``; the prompt is drawn per epoch in
        `sample_length`."""
        caption, _ = self.document_ids([(self.sample_text(sample).strip(), True)], sample)
        return (len(caption) - 1, *self.image_facts(self.sample_images(sample)))

    def document_layout(
        self, facts: tuple[int, ...], key: str, epoch: int
    ) -> tuple[tuple[int, int, int], int, int]:
        """``(id layout (see fitted_length), images, tiles)`` of the sample's document at ``epoch``."""
        caption, num_images, num_tiles = facts
        index = self.instruction_index(length_probe(key, epoch))
        if (index, num_images) not in self._prompt_layouts:
            instruction = (
                self.config.prompt.instructions[index] if self.config.prompt.instructions else ""
            )
            ids, targets = self.document_ids(
                [(self.config.prompt.user_text(instruction, num_images), False)], None
            )
            self._prompt_layouts[index, num_images] = self.id_layout(
                ids, targets, self.image_token_index
            )[:2]
        prompt, placeholder_end = self._prompt_layouts[index, num_images]
        return (
            (prompt + caption, placeholder_end, prompt if caption else prompt + caption),
            num_images,
            num_tiles,
        )

    def sample_length(self, facts: tuple[int, ...], key: str, epoch: int) -> tuple[int, int]:
        layout, num_images, num_tiles = self.document_layout(facts, key, epoch)
        row = (
            self.fitted_length(layout, num_images, num_tiles, key)
            + 1
            + self.extra_positions(num_images, num_tiles)
        )
        return row, row

    def encoded_length(self, doc: EncodedDoc) -> tuple[int, int]:
        row = self.spliced_length(doc)
        return row, row

    # --- cost features: the row is the spliced length; every tile goes through the vision tower --

    def fact_media_features(
        self, facts: tuple[int, ...], key: str, epoch: int, lengths: tuple[int, int] | None = None
    ) -> dict[str, float]:
        # every vision-language encoder's facts end with its `image_facts`: (images, tiles)
        return features(vision_tiles=facts[-1])

    def doc_media_features(self, doc: EncodedDoc) -> dict[str, float]:
        return features(vision_tiles=int(doc.media["num_tiles"].sum()))

    def batch_row_lengths(self, batch: SplicedFields) -> torch.Tensor:
        return batch.spliced_lengths

    def batch_media_features(self, batch: ImageFields) -> dict[str, float]:
        return features(vision_tiles=batch.images.shape[0])

    # --- packing and batching ------------------------------------------------------------------

    def select_samples_to_pack(self, samples: list[EncodedDoc]) -> list[list[EncodedDoc]]:
        groups = first_fit_decreasing(
            [self.spliced_length(d) for d in samples],
            [sample_key(d) for d in samples],
            self.seq_len,
            self.config.packing.max_docs,
        )
        return [[samples[i] for i in group] for group in groups]

    def _pack(self, docs: list[EncodedDoc]) -> Pack:
        pack = super()._pack(docs)
        loss_mask, start = pack.row["loss_mask"], 0
        for doc in docs:
            length = int(doc.tokens.numel())
            loss_mask[start : start + length - 1] = doc.media["targets"][1:].to(torch.float32)
            start += length
        return pack

    def collate_media(self, docs: list[EncodedDoc]) -> dict[str, Any]:
        images = [d.media["images"] for d in docs]
        return {
            "images": torch.cat(images).contiguous(),
            "num_tiles": torch.cat([d.media["num_tiles"] for d in docs]),
            "num_images": torch.tensor(
                [d.media["num_tiles"].numel() for d in docs], dtype=torch.int32
            ),
            "spliced_lengths": torch.tensor(
                [self.spliced_length(d) for d in docs], dtype=torch.int32
            ),
            "image_token_index": int(self.image_token_index),
            "tokens_per_tile": int(self.tokens_per_tile),
        }
