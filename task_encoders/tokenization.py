"""Text → token ids through any local Hugging Face tokenizer folder.

Contract of `TextTokenizer.encode`: int64 tensor ``[BOS, t1, ..., tk, EOS]`` of length
``2 <= L <= seq_len``; text past ``seq_len - 2`` content tokens is cut, EOS is kept. Deterministic
(no randomness, no worker state).

Special tokens such as the image placeholder ``<image>``: `TextTokenizer.add_special_tokens`
adds them the way Megatron-LM's multimodal tokenizer does for ``--special-tokens``
(``AutoTokenizer.add_tokens(tokens, special_tokens=True)``: a token the folder already has keeps its
id, a new one is appended after the vocabulary, in the order given). The shipped tokenizer has
``<image>`` already (id 2047); a user's own folder gets it appended, exactly as Megatron does when
it loads the same folder with the same ``--special-tokens`` list, so both sides agree on
``image_token_index``. The text of a special token always encodes to its one id.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from task_encoders.config import TextConfig
from task_encoders.config_parser import At

# Tokenizing single texts gains nothing from Rust threads, and a tokenizer used before the
# DataLoader forks its workers would otherwise warn in every worker.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

#: ``model_max_length`` of the tokenizers the encoders use (they cut to ``seq_len`` themselves).
UNLIMITED = 1 << 62

#: The tokenizer the repository ships (built offline by ``scripts/build_tokenizer.py``).
DEFAULT_TOKENIZER_DIR = Path(__file__).resolve().parent / "assets" / "tokenizer"


def load_hf_tokenizer(path: Path):
    """``AutoTokenizer.from_pretrained(path)`` from local files. The shipped folder
    (`DEFAULT_TOKENIZER_DIR`, whose ``tokenizer_config.json`` names the generic fast class) is loaded
    by that class directly: the same tokenizer AutoTokenizer returns for it (a test holds the two
    equal), without AutoTokenizer's look-up of the model registry, about 0.4 s of CPU in every
    process that builds an encoder. Any other folder goes through ``AutoTokenizer``."""
    if path.resolve() == DEFAULT_TOKENIZER_DIR:
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(str(path), local_files_only=True)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


@dataclass(frozen=True)
class SpecialIds:
    pad: int
    bos: int
    eos: int


class TextTokenizer:
    """Wraps a Hugging Face tokenizer (`load_hf_tokenizer`) for one `TextConfig`.

    Construction loads the tokenizer and resolves BOS/EOS/PAD; any problem is a
    `task_encoders.config_parser.ConfigError` naming ``text.tokenizer`` or the token key.
    """

    def __init__(self, config: TextConfig, at: At | None = None):
        at = (at or At()).child("text")
        self.path = (
            Path(config.tokenizer) if config.tokenizer is not None else DEFAULT_TOKENIZER_DIR
        )
        self.seq_len = config.seq_len
        if not self.path.is_dir():
            raise at.child("tokenizer").error(
                f"no directory {self.path}", "a local Hugging Face tokenizer directory"
            )
        try:
            self.hf = load_hf_tokenizer(self.path)
        except Exception as e:  # transformers raises OSError/ValueError/... for broken folders
            raise at.child("tokenizer").error(
                f"cannot load {self.path}: {e}", "a Hugging Face tokenizer"
            ) from None
        # The encoders cut token ids to ``seq_len`` themselves: the tokenizer's own limit only
        # warned ("indexing errors") for every caption longer than the model it was made for.
        self.hf.model_max_length = UNLIMITED
        bos = self._token_id(config.bos_token, self.hf.bos_token_id, at.child("bos_token"))
        eos = self._token_id(config.eos_token, self.hf.eos_token_id, at.child("eos_token"))
        pad_default = self.hf.pad_token_id if self.hf.pad_token_id is not None else eos
        self.special = SpecialIds(
            pad=self._token_id(config.pad_token, pad_default, at.child("pad_token")),
            bos=bos,
            eos=eos,
        )

    def _token_id(self, token: str | None, default: int | None, at: At) -> int:
        if token is None:
            if default is None:
                raise at.error(
                    f"tokenizer {self.path} defines none", "a token string in the config"
                )
            return int(default)
        token_id = self.hf.convert_tokens_to_ids(token)
        if token_id is None or (token_id == self.hf.unk_token_id and token != self.hf.unk_token):
            raise at.error(
                f"{token!r} is not in the vocabulary of {self.path}", "a token of the tokenizer"
            )
        return int(token_id)

    def add_special_tokens(
        self, tokens: tuple[str, ...] | list[str], at: At | None = None
    ) -> dict[str, int]:
        """Add ``tokens`` as special tokens (module doc); returns ``{token: id}``. A token that the
        vocabulary has as an ordinary (non-special) token is refused (its text would then also be
        part of ordinary words): ``ConfigError`` at ``at``."""
        at = at or At()
        tokens = list(tokens)
        if len(set(tokens)) != len(tokens) or not all(isinstance(t, str) and t for t in tokens):
            raise at.error(f"got {tokens!r}", "distinct non-empty token strings")
        special = set(self.hf.all_special_tokens) | {
            t.content for t in self.hf.added_tokens_decoder.values() if t.special
        }
        vocab = self.hf.get_vocab()
        for token in tokens:
            if token in vocab and token not in special:
                raise at.error(
                    f"{token!r} is an ordinary token of {self.path}",
                    "a token the tokenizer does not have, or has as a special token",
                )
        self.hf.add_tokens(tokens, special_tokens=True)
        ids = {t: int(self.hf.convert_tokens_to_ids(t)) for t in tokens}
        for token, token_id in ids.items():
            if self.hf(token, add_special_tokens=False)["input_ids"] != [token_id]:
                raise at.error(
                    f"{token!r} does not encode to its own id {token_id}",
                    "a token the tokenizer keeps whole",
                )
        return ids

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    def encode(self, text: str) -> torch.Tensor:
        """int64 ``(L,)``: BOS, content ids (cut to ``seq_len - 2``), EOS."""
        ids = self.hf(text, add_special_tokens=False)["input_ids"][: self.seq_len - 2]
        return torch.tensor([self.special.bos, *ids, self.special.eos], dtype=torch.int64)

    def decode(self, ids: torch.Tensor | list[int]) -> str:
        """Text of ``ids`` without special tokens (round trip of `encode`'s content)."""
        return self.hf.decode(ids, skip_special_tokens=True)
