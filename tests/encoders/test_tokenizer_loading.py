"""The shipped tokenizer folder is loaded by its class directly, not through ``AutoTokenizer``
(which would look up the model registry in every process); it must be the very tokenizer
``AutoTokenizer`` returns, and any other folder still goes through ``AutoTokenizer``."""

from __future__ import annotations

import shutil

import pytest

from task_encoders.tokenization import DEFAULT_TOKENIZER_DIR, load_hf_tokenizer

TEXTS = [
    "A man riding a horse on the beach.",
    "<image> Two cats, 12345 émojis 🐈 and\ttabs\n new lines   spaces",
    "",
]


def test_the_shipped_folder_gives_what_autotokenizer_gives():
    from transformers import AutoTokenizer

    ours = load_hf_tokenizer(DEFAULT_TOKENIZER_DIR)
    auto = AutoTokenizer.from_pretrained(str(DEFAULT_TOKENIZER_DIR), local_files_only=True)
    assert type(ours) is type(auto)
    assert ours.backend_tokenizer.to_str() == auto.backend_tokenizer.to_str()
    assert ours.get_vocab() == auto.get_vocab() and len(ours) == len(auto)
    assert ours.all_special_tokens == auto.all_special_tokens
    assert (ours.bos_token_id, ours.eos_token_id, ours.pad_token_id, ours.unk_token_id) == (
        auto.bos_token_id,
        auto.eos_token_id,
        auto.pad_token_id,
        auto.unk_token_id,
    )
    for text in TEXTS:
        ids = ours(text, add_special_tokens=False)["input_ids"]
        assert ids == auto(text, add_special_tokens=False)["input_ids"]
        assert ours.decode(ids, skip_special_tokens=True) == auto.decode(
            ids, skip_special_tokens=True
        )


def test_only_the_shipped_folder_skips_autotokenizer(tmp_path, monkeypatch):
    import transformers

    def refuse(*args, **kwargs):
        raise RuntimeError("AutoTokenizer called")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", refuse)
    assert len(load_hf_tokenizer(DEFAULT_TOKENIZER_DIR)) > 0
    copy = shutil.copytree(DEFAULT_TOKENIZER_DIR, tmp_path / "tok")
    with pytest.raises(RuntimeError, match="AutoTokenizer called"):
        load_hf_tokenizer(copy)


def test_a_caption_longer_than_the_tokenizers_model_is_cut_without_its_warning(tmp_path, caplog):
    """A tokenizer made for a shorter model warned "indexing errors" for every long caption,
    though the encoders cut to seq_len themselves."""
    import json
    import logging

    from task_encoders.config import TextConfig
    from task_encoders.tokenization import TextTokenizer

    folder = shutil.copytree(DEFAULT_TOKENIZER_DIR, tmp_path / "tok")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "model_max_length": 8}))
    caplog.set_level(logging.WARNING)
    tok = TextTokenizer(TextConfig(tokenizer=folder, seq_len=16))
    ids = tok.encode(" ".join(["a long caption"] * 20))
    assert len(ids) == 16 and "indexing errors" not in caplog.text
