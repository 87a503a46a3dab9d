"""Per-key tensors are the same in a separate process (fresh interpreter, other worker count)."""

import json

import pytest

from tests.helpers.cli import run_python

SCRIPT = """
import json, sys
from tests.conftest import per_doc_digests, SMALL_IMAGE
from megatron.energon import get_savable_loader, get_val_dataset
from task_encoders.registry import get_encoder

encoder = get_encoder({"encoder": "image_text", "seed": 1234, "image": SMALL_IMAGE,
                       "text": {"tokenizer": sys.argv[2], "seq_len": 32}})
dataset = get_val_dataset(sys.argv[1], split_part="train", batch_size=3, task_encoder=encoder,
                          worker_config=encoder.worker_config(num_workers=2))
digests = {}
for batch in get_savable_loader(dataset):
    digests.update(per_doc_digests(batch))
print("DIGESTS " + json.dumps(digests))
"""


@pytest.mark.slow
def test_two_processes_produce_identical_tensors_per_key(
    image_text_encoder, image_text_shards, tokenizer_dir, one_pass, doc_digests
):
    result = run_python(SCRIPT, image_text_shards, tokenizer_dir, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    line = next(x for x in result.stdout.splitlines() if x.startswith("DIGESTS "))
    theirs = json.loads(line[len("DIGESTS ") :])
    ours = {
        k: v
        for b in one_pass(image_text_encoder, image_text_shards, num_workers=0)
        for k, v in doc_digests(b).items()
    }
    assert len(ours) == 24 and theirs == ours
