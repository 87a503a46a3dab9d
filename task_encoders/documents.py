"""``DocumentTaskEncoder``: text documents (with optional per-document media) → LM batches.

Pipeline (Energon hooks, all map functions ``@stateless``):

1. ``encode_sample`` → `DocumentTaskEncoder.encode`: ``sample_text`` → token ids
   (`task_encoders.tokenization`), ``encode_media`` → per-document tensors; gives an
   `EncodedDoc`.
2. With ``packing.enabled`` (and Energon's ``packing_buffer_size``): ``select_samples_to_pack``
   groups a buffer of documents by first-fit decreasing into rows of ``text.seq_len`` tokens, and
   ``pack_selected_samples`` lays each group out as a `Pack`. Without packing every document is
   its own row.
3. ``batch``: rows → `TextBatch` (or the encoder's ``batch_type``), with the modality's
   tensors from ``collate_media``.

A modality subclass overrides ``encode_media``/``collate_media`` (and ``sample_text`` if its
samples keep text elsewhere) and sets ``batch_type``; see docs/encoders.md, "Adding a modality".
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any, ClassVar

import torch
from megatron.energon import Batch, Sample, edataclass, stateless

from task_encoders.base import ConfigLike, SeededTaskEncoder
from task_encoders.batch_tensors import Medium
from task_encoders.features import FEATURES, features, summed, text_features, with_lengths
from task_encoders.seeding import sample_key
from task_encoders.sequences import collate_rows, first_fit_decreasing, layout_row, padded_length
from task_encoders.tokenization import TextTokenizer


@edataclass
class EncodedDoc(Sample):
    """One encoded document. ``tokens``: int64 ``(L,)``, ``[BOS, ..., EOS]``, ``2 <= L <= seq_len``.
    ``media``: the encoder's per-document tensors by name (e.g. ``{"image": (C, H, W)}``)."""

    tokens: torch.Tensor
    media: dict


@edataclass
class Pack(Sample):
    """Documents that share one row, with the row laid out (`task_encoders.sequences.layout_row`)."""

    docs: list
    row: dict


@edataclass
class TextBatch(Batch):
    """A batch of ``N`` rows of ``S = text.seq_len`` tokens holding ``D >= N`` documents.

    Fields (conventions in `task_encoders.sequences`):

    * ``keys``: list[str] ``(D,)``, sample keys in document order (row by row); also ``__key__``.
    * ``tokens``: int64 ``(N, S)``; ``labels``: int64 ``(N, S)``, next-token targets;
      ``loss_mask``: float32 ``(N, S)``, 1.0 where ``labels`` is a real target;
      ``position_ids``: int64 ``(N, S)``, restarting at every document.
    * ``cu_seqlens``: int32 ``(D + 1,)``, document boundaries in the flattened ``N * S`` tokens (row
      padding belongs to the row's last document), ``cu_seqlens[-1] == N * S``; ``max_seqlen``: int,
      longest segment.
    * ``num_docs``: int32 ``(N,)``, documents per row; ``doc_lengths``: int32 ``(D,)``, unpadded.

    Without packing ``D == N``, ``num_docs`` is all ones and row ``i`` is ``keys[i]``.

    The class says which tensors it holds (`task_encoders.batch_tensors`): ``row_tensors``,
    ``media`` and ``undigested``; a subclass with tensors of its own extends ``media`` (and
    ``undigested``).
    """

    #: the ``(N, S)`` fields, one row each, that a row's digest covers
    row_tensors: ClassVar[tuple[str, ...]] = ("tokens", "labels", "loss_mask", "position_ids")
    #: the media of the documents, in the order a row's digest takes them (none for text)
    media: ClassVar[tuple[Medium, ...]] = ()
    #: tensors a row's digest leaves out: where the documents lie (they follow from the rows)
    undigested: ClassVar[tuple[str, ...]] = ("cu_seqlens", "num_docs", "doc_lengths")

    keys: list
    tokens: torch.Tensor
    labels: torch.Tensor
    loss_mask: torch.Tensor
    position_ids: torch.Tensor
    cu_seqlens: torch.Tensor
    max_seqlen: int
    num_docs: torch.Tensor
    doc_lengths: torch.Tensor

    @classmethod
    def tensor_fields(cls) -> tuple[str, ...]:
        """Every tensor field the class declares: ``row_tensors``, its media's fields (with their
        counts and lengths), ``undigested``; each once."""
        names = [*cls.row_tensors, *(n for m in cls.media for n in m.names()), *cls.undigested]
        return tuple(dict.fromkeys(names))

    @classmethod
    def device_fields(cls) -> tuple[str, ...]:
        """The fields a trainer moves to its device: ``row_tensors``, ``cu_seqlens`` and each
        medium's tensor and valid lengths (the counts that place them stay on the host)."""
        media = (n for m in cls.media for n in (m.field, m.lengths) if n)
        return tuple(dict.fromkeys([*cls.row_tensors, "cu_seqlens", *media]))

    def to(self, device: torch.device | str, non_blocking: bool = False) -> TextBatch:
        """A copy of this batch (the same type) with every tensor on ``device``; the batch itself is
        frozen and unchanged. Trainers that move a batch by calling its ``.to(device)`` (Lightning's
        default ``transfer_batch_to_device``) move ours so."""
        return moved(self, device, non_blocking)


def moved(value: Any, device: torch.device | str, non_blocking: bool = False) -> Any:
    """``value`` with every tensor moved to ``device``: tensors, dataclasses (frozen ones included:
    a new instance of the same type, fields without ``init`` left to it), dicts, lists, tuples and
    namedtuples, nested; anything else as it is (sample keys, ints). A tensor already on ``device``
    is not copied."""
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=non_blocking)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {
            f.name: moved(getattr(value, f.name), device, non_blocking)
            for f in dataclasses.fields(value)
            if f.init
        }
        return dataclasses.replace(value, **changes)
    if isinstance(value, dict):
        return type(value)((k, moved(v, device, non_blocking)) for k, v in value.items())
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        return type(value)(*(moved(v, device, non_blocking) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(moved(v, device, non_blocking) for v in value)
    return value


def length_probe(key: str, epoch: int) -> Any:
    """A stand-in for the sample of ``key`` at ``epoch`` that `SeededTaskEncoder.sample_generator`
    seeds exactly as it seeds the real sample (it reads only ``__key__`` and ``__subflavors__["epoch"]``)."""
    return SimpleNamespace(__key__=key, __subflavors__={"epoch": epoch})


class DocumentTaskEncoder(SeededTaskEncoder):
    """Tokenization, packing and batching for document-per-sample modalities (module doc).

    Deterministic: the rows and batches depend only on the documents Energon hands in; packing
    decisions depend on the buffer's (length, key) multiset, not on arrival order.
    """

    #: The batch dataclass; subclasses add their media fields.
    batch_type: ClassVar[type[TextBatch]] = TextBatch
    #: Packing pads every document's segment to a multiple of this (loss-masked positions after
    #: it; `task_encoders.sequences.layout_row`): ``2N`` for ``N`` context-parallel ranks,
    #: set by the loader from ``loader.context_parallel``. Rows and plans count padded lengths.
    segment_multiple: int = 1
    #: Whether a `segment_multiple` above 1 is exact for this encoder (its row lengths are
    #: token positions of the row).
    pads_segments: ClassVar[bool] = True

    def __init__(
        self, config: ConfigLike = None, *, seed: int | None = None, training: bool = True
    ):
        super().__init__(config, seed=seed, training=training)
        self.tokenizer = TextTokenizer(self.config.text, self.config_at)

    @property
    def seq_len(self) -> int:
        return self.config.text.seq_len

    @property
    def packing_buffer_size(self) -> int | None:
        """What to pass as Energon's ``packing_buffer_size``: None unless ``packing.enabled``."""
        packing = self.config.packing
        return packing.buffer_size if packing.enabled else None

    # --- per sample ----------------------------------------------------------------------------

    def encode(self, sample: Any) -> EncodedDoc:
        media = self.encode_media(sample)
        tokens = self.tokenizer.encode(self.sample_text(sample))
        return EncodedDoc.derive_from(sample, tokens=tokens, media=media)

    def sample_text(self, sample: Any) -> str:
        """The document text: ``caption`` (CaptioningSample) or ``text`` (TextSample, AudioTextSample)."""
        for name in ("caption", "text"):
            text = getattr(sample, name, None)
            if isinstance(text, str):
                return text
        raise TypeError(f"{type(sample).__name__} has no str 'caption' or 'text' field")

    def encode_media(self, sample: Any) -> dict[str, torch.Tensor]:
        """Per-document tensors of the modality (none for plain text)."""
        return {}

    def collate_media(self, docs: list[EncodedDoc]) -> dict[str, Any]:
        """Batch fields built from the documents' media, in document order (none for plain text)."""
        return {}

    # --- lengths without decoding --------------------------------------------------------------
    #
    # Contract shared by every document encoder:
    #
    # * ``sample_facts(light)``: ``facts_width`` ints >= 0, independent of the epoch, from a *light*
    #   sample (`energon_platform.loader.light_sample.light_sample`: the sample type built through
    #   the field map with media parts left as file bytes; decoded samples work too). Reads media headers
    #   and tokenizes text; never decodes pixels or audio. Raises (``ValueError``) when ``encode`` would
    #   reject the sample at every epoch.
    # * ``sample_length(facts, key, epoch)``: ``(row_length, work_length)`` equal to
    #   ``encoded_length(encode(sample))`` for the sample of that final key (as the loader sets it,
    #   ``"{dataset}:"`` prefix included) at that epoch; seeded draws that change lengths are redrawn
    #   from `length_probe`. Raises ``ValueError`` when ``encode`` would reject the sample at that
    #   epoch, ``NotImplementedError`` (one line) for a config whose lengths need decoded media.
    # * ``row_length``: the positions the document takes in a packed row (what
    #   ``select_samples_to_pack`` counts); ``work_length``: ``row_length`` plus what the model
    #   processes outside the row for it (audio feature frames, video frames); equal for text and for
    #   images spliced into the row.
    #
    # The base implementation is for text documents (`sample_text` tokenized and cut to
    # ``text.seq_len``); a subclass that changes the tokens or adds work outside the row overrides all
    # three and ``facts_width``.

    #: How many ints `sample_facts` returns (fixed per encoder instance).
    facts_width: int = 1

    def sample_facts(self, sample: Any) -> tuple[int, ...]:
        """``(content tokens of sample_text, uncut,)``."""
        return (self.count_tokens(self.sample_text(sample)),)

    def sample_length(self, facts: tuple[int, ...], key: str, epoch: int) -> tuple[int, int]:
        row = self.text_row_length(facts[0])
        return row, row

    def encoded_length(self, doc: EncodedDoc) -> tuple[int, int]:
        row = int(doc.tokens.numel())
        return row, row

    def count_tokens(self, text: str) -> int:
        """Content tokens of ``text`` (no BOS/EOS, no cut), as `TextTokenizer.encode` makes them."""
        return len(self.tokenizer.hf(text, add_special_tokens=False)["input_ids"])

    def text_row_length(self, content_tokens: int) -> int:
        """Length of ``TextTokenizer.encode`` of a text of ``content_tokens`` tokens: BOS + content cut
        to ``seq_len - 2`` + EOS."""
        return min(content_tokens, self.seq_len - 2) + 2

    # --- cost features (task_encoders.features) -----------------------------------------------
    #
    # Three views of a document's cost, equal for the same sample at the same epoch:
    # ``sample_features(facts, key, epoch)`` (the length index's facts, no decoding; raises as
    # ``sample_length`` does), ``encoded_features(doc)`` and ``batch_features(batch)`` (the sum over
    # the batch's documents, read from its tensors, packed or not). Each is the language model's
    # part (``samples``, ``llm_tokens`` = the row length, ``llm_attention``), shared here, plus the
    # media's part, which is what a modality states:
    #
    # * ``work_feature``: the feature that the work outside the row counts (``work_length -
    #   row_length``: audio frames, video frames, points); the fact and document views follow from
    #   the lengths. Or override `fact_media_features` and `doc_media_features`.
    # * `batch_media_features`: the same feature read from the batch's media tensors.

    #: The cost feature the work outside the row counts (None: no such work); a name of FEATURES.
    work_feature: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        if cls.work_feature is not None and cls.work_feature not in FEATURES:
            raise TypeError(
                f"{cls.__qualname__}.work_feature is {cls.work_feature!r}, not a cost feature; "
                f"one of {list(FEATURES)} (task_encoders.features)"
            )

    def sample_features(
        self, facts: tuple[int, ...], key: str, epoch: int, lengths: tuple[int, int] | None = None
    ) -> dict[str, float]:
        """The cost features of the sample of these facts, final ``key`` and ``epoch`` (no decoding).
        ``lengths``: its `sample_length` at these arguments where the caller has it (the loader's
        lookup does), so that it is not derived again; None: derived here."""
        if lengths is None:
            lengths = self.sample_length(facts, key, epoch)
        media = with_lengths(self.fact_media_features, facts, key, epoch, lengths)
        return summed([text_features(lengths[0]), media])

    def encoded_features(self, doc: EncodedDoc) -> dict[str, float]:
        """The cost features of an encoded document."""
        row, _ = self.encoded_length(doc)
        return summed([text_features(row), self.doc_media_features(doc)])

    def batch_features(self, batch: TextBatch) -> dict[str, float]:
        """The sum of the cost features of the documents ``batch`` holds, from its tensors."""
        lengths = self.batch_row_lengths(batch).to(torch.float64)
        text = features(
            samples=lengths.numel(),
            llm_tokens=float(lengths.sum()),
            llm_attention=float((lengths * lengths).sum()),
        )
        return summed([text, self.batch_media_features(batch)])

    def fact_media_features(
        self, facts: tuple[int, ...], key: str, epoch: int, lengths: tuple[int, int] | None = None
    ) -> dict[str, float]:
        """The media's features from the facts: ``work_feature`` counts ``work - row``.
        ``lengths``: the sample's `sample_length` at these arguments (None: derived here). An
        override may leave ``lengths`` out of its signature; it is then called without."""
        return self.work_features(lengths or self.sample_length(facts, key, epoch))

    def doc_media_features(self, doc: EncodedDoc) -> dict[str, float]:
        """The media's features of an encoded document: ``work_feature`` counts ``work - row``."""
        return self.work_features(self.encoded_length(doc))

    def work_features(self, lengths: tuple[int, int]) -> dict[str, float]:
        """``{work_feature: work - row}`` of ``(row, work)`` lengths (nothing without one)."""
        row, work = lengths
        return features(**({self.work_feature: work - row} if self.work_feature else {}))

    def batch_row_lengths(self, batch: Any) -> torch.Tensor:
        """``(D,)`` row lengths of the batch's documents (what ``encoded_length`` gives as row).
        ``batch``: of ``batch_type``, or a multimodal batch with the same fields (overrides name
        the fields they read: `task_encoders.batch_fields`)."""
        return batch.doc_lengths

    def batch_media_features(self, batch: Any) -> dict[str, float]:
        """The media's features summed over the batch's documents (none for plain text); ``batch``
        as for `batch_row_lengths`."""
        return features()

    # --- packing and batching ------------------------------------------------------------------

    def build_batch(
        self, dataset: Any, *, packing_buffer_size: int | None = None, **kwargs: Any
    ) -> Any:
        """Energon's batching stage; refuses a packing setting that contradicts the config."""
        if (packing_buffer_size is not None) != self.config.packing.enabled:
            raise ValueError(
                f"{self.config_at.source}: packing.enabled is {self.config.packing.enabled} but Energon got "
                f"packing_buffer_size={packing_buffer_size}; pass the encoder's packing_buffer_size "
                f"({self.packing_buffer_size}) to get_train_dataset/get_val_dataset"
            )
        return super().build_batch(dataset, packing_buffer_size=packing_buffer_size, **kwargs)

    def select_samples_to_pack(self, samples: list[EncodedDoc]) -> list[list[EncodedDoc]]:
        groups = first_fit_decreasing(
            [padded_length(int(d.tokens.numel()), self.segment_multiple) for d in samples],
            [sample_key(d) for d in samples],
            self.seq_len,
            self.config.packing.max_docs,
        )
        return [[samples[i] for i in group] for group in groups]

    @stateless
    def pack_selected_samples(self, samples: list[EncodedDoc]) -> Pack:
        return self._pack(samples)

    def _pack(self, docs: list[EncodedDoc]) -> Pack:
        row = layout_row(
            [d.tokens for d in docs],
            self.seq_len,
            self.tokenizer.special.pad,
            multiple=self.segment_multiple,
        )
        return Pack.derive_from(
            docs[0],
            __key__="+".join(sample_key(d) for d in docs),
            docs=list(docs),
            row=row,
            __sources__=tuple(s for d in docs for s in d.__sources__ or ()),
        )

    @stateless
    def batch(self, samples: list[EncodedDoc] | list[Pack]) -> TextBatch:
        packs = [s if isinstance(s, Pack) else self._pack([s]) for s in samples]
        docs = [d for p in packs for d in p.docs]
        keys = [sample_key(d) for d in docs]
        return self.batch_type(
            __key__=keys,
            __restore_key__=(),
            __subflavors__=[d.__subflavors__ for d in docs],
            __sources__=tuple(s for p in packs for s in p.__sources__ or ()),
            keys=keys,
            **collate_rows([p.row for p in packs]),
            **self.collate_media(docs),
        )
