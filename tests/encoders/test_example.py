"""The worked example of docs/encoders.md (section "Adding a modality"): importable, registered, and trains a batch
through Energon's loader; the document shows the module's exact code."""

import dataclasses
import importlib
import re

import torch
from megatron.energon import get_savable_loader, get_train_dataset

from task_encoders.registry import available, get_encoder
from tests.helpers import REPO


def test_example_trains_a_batch_through_energons_loader(audio_text_shards, tokenizer_dir):
    module = importlib.import_module("task_encoders.examples.waveform_text")
    assert "waveform_text" in available()
    encoder = get_encoder(
        {
            "module": "task_encoders.examples.waveform_text",
            "encoder": "waveform_text",
            "text": {"tokenizer": str(tokenizer_dir), "seq_len": 32},
        }
    )
    assert isinstance(encoder, module.WaveformTextTaskEncoder)
    dataset = get_train_dataset(
        audio_text_shards,
        worker_config=encoder.worker_config(num_workers=1),
        batch_size=4,
        shuffle_buffer_size=4,
        max_samples_per_sequence=None,
        task_encoder=encoder,
    )
    batch = next(iter(get_savable_loader(dataset)))
    assert isinstance(batch, module.WaveformTextBatch) and len(batch.keys) == 4
    assert batch.waveforms.dtype == torch.float32 and batch.waveforms.shape[0] == 4
    assert batch.waveform_lengths.max() == batch.waveforms.shape[1]

    # One optimiser step of a toy model that reads both modalities.
    torch.manual_seed(0)
    embed = torch.nn.Embedding(encoder.tokenizer.vocab_size, 16)
    audio = torch.nn.Linear(1, 16)
    head = torch.nn.Linear(16, encoder.tokenizer.vocab_size)
    params = [*embed.parameters(), *audio.parameters(), *head.parameters()]
    optimizer = torch.optim.SGD(params, lr=0.1)
    energy = (batch.waveforms**2).sum(1, keepdim=True) / batch.waveform_lengths[:, None]
    hidden = embed(batch.tokens) + audio(energy)[:, None, :]
    losses = torch.nn.functional.cross_entropy(
        head(hidden).transpose(1, 2), batch.labels, reduction="none"
    )
    loss = (losses * batch.loss_mask).sum() / batch.loss_mask.sum()
    before = head.weight.detach().clone()
    loss.backward()
    optimizer.step()
    assert torch.isfinite(loss) and not torch.equal(before, head.weight)


def test_gain_is_seeded_per_key_and_epoch(tokenizer_dir, raw_samples):

    encoder = get_encoder(
        {
            "module": "task_encoders.examples.waveform_text",
            "encoder": "waveform_text",
            "text": {"tokenizer": str(tokenizer_dir)},
        }
    )
    sample = raw_samples("audio_text")[0]
    first, again = (encoder.encode_sample(sample).media["waveform"] for _ in range(2))
    later = encoder.encode_sample(dataclasses.replace(sample, __subflavors__={"epoch": 1})).media[
        "waveform"
    ]
    assert torch.equal(first, again) and not torch.equal(first, later)


def test_the_document_shows_the_example_module_verbatim():
    doc = (REPO / "docs" / "encoders.md").read_text()
    source = (REPO / "task_encoders" / "examples" / "waveform_text.py").read_text()
    blocks = re.findall(r"```python\n(.*?)```", doc, flags=re.S)
    assert source in blocks, (
        "docs/encoders.md, section 'Adding a modality', must show task_encoders/examples/waveform_text.py verbatim"
    )
