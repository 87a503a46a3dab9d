"""What a batch type says about its tensors: `Medium`, one medium's tensor and where its items go.

Each batch class (`task_encoders.documents.TextBatch` and its subclasses) declares, as class
attributes that subclasses extend:

* ``row_tensors``: the ``(N, S)`` text fields, one row each (tokens, labels, loss mask, positions);
* ``media``: its `Medium` entries, in the order a row's digest takes them;
* ``undigested``: the tensors a row's digest leaves out (document boundaries and counts that place
  the digested tensors, and flags beside them).

Every tensor field of the class is in exactly one of the three (a test holds it); the row digest
(`energon_platform.training.digests`) and the fields the reference trainer moves to the device are
read from them, so a new modality is one batch class.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Medium:
    """One medium of a batch: ``field`` holds its items along dim 0.

    * ``per_doc``: the int field counting each document's items (``num_images``); None: one item
      per document, in document order.
    * ``per_item``: the int field counting the tensors of each of those items (a vision-language
      image's ``num_tiles``); None: one tensor per item.
    * ``lengths``: the field of each tensor's valid length along ``axis`` (``-1``: time of audio
      features, ``0``: a clip's frames); None: the whole tensor is valid.
    """

    field: str
    per_doc: str | None = None
    per_item: str | None = None
    lengths: str | None = None
    axis: int = 0

    def names(self) -> tuple[str, ...]:
        """The batch fields this medium reads: ``field`` and those of its counts and lengths."""
        return tuple(n for n in (self.field, self.per_doc, self.per_item, self.lengths) if n)
