"""The row digests of real batches of the shipped encoders (image-text, text, audio-text,
vision-language tiles, multimodal), recorded before the batch types declared their tensors: moving
the list of digested media onto the batch classes changed none of them."""

from __future__ import annotations

import pytest

from energon_platform.training.digests import row_digests
from tests.conftest import SMALL_AUDIO, SMALL_IMAGE

#: the modalities of the multimodal encoder, with conftest's test sizes
MODALITIES = {
    "image_text": {"image": SMALL_IMAGE},
    "audio_text": {"audio": SMALL_AUDIO},
    "text": {},
}

#: name → (encoder, its ``make_encoder`` sections, the ``make_dataset`` kind it reads)
ENCODERS = {
    "image_text": ("image_text", {}, "image_text"),
    "text": ("text", {}, "image_text"),
    "audio_text": ("audio_text", {}, "audio_text"),
    "vision_language": (
        "image_text",
        {
            "prompt": {"enabled": True},
            "text": {"seq_len": 128},
            "vision": {"model_type": "clip", "image_size": 16, "patch_dim": 8},
            "image": {
                "tiling": {"enabled": True, "max_num_tiles": 4, "use_thumbnail": True},
                "transforms": [{"name": "RandomHorizontalFlip"}],
            },
        },
        "image_text",
    ),
    "multimodal_image": ("multimodal", {"modalities": MODALITIES}, "image_text"),
    "multimodal_audio": ("multimodal", {"modalities": MODALITIES}, "audio_text"),
}

#: batch type and ``row_digests`` of the first two batches, recorded with the reference trainer's
#: digest (``training.train.batch_digest``) before the batch types declared their tensors
RECORDED = {
    "audio_text": (
        "AudioTextBatch",
        [
            "c483e251a2829b7cb236ec1568f2732f92c14d2899dcc1bb598c67e9af4d15e1",
            "2064e891fcf4f59867a4fd40c6e2b91675d751cd4e9ba54976f7e4bba3b73b28",
            "9a619b70dc6f87bd6d116fd34a7032489c084da4732e6993fffb0a91c23c203a",
            "d83476019540ca8d0c853210d190823e38989bf6b9190d12e3e737cd225c07d4",
            "d958dd28d708d885c3fa1c69e29d45933d66d9e3fc7675f334d0c58dab50e261",
            "86d5ca15533649fecbd3256d00a8b9f3a879c5a4bd0714725e0222065e119e30",
            "b139d91d03e2183833687fcf56e0ca88e320ea71fa4a49685e89e5ca0840f5f3",
            "ac44e8762f5f5c8563db1fb8f0e53040dab33117905d7fa2f3710741def76aef",
        ],
    ),
    "image_text": (
        "ImageTextBatch",
        [
            "24c66f497fd0be703e058b4cff20d09510f0fd167da5b2de7dae66e312efc0bb",
            "d8cd2b92ef9306c425a6e12322c9c6560f18f8648febd15778b0de505c1004e9",
            "fb95fc4cbc349a95cc055aa96685dc61c601017cc415a9ad67dd5612edc51393",
            "9746eb921172486c96ef9e4a527b15eeb7d1c6cd10c98004771ea687033599ad",
            "db8edbae6548947d008a5c60a1e1dd03527bcb8acda8b30337e147135bd5e077",
            "b386812ccb5e6aced280ba6c93df762ae86ffe917306d853105a27d1b1401560",
            "1c737a87581c80b66c60f7dd48f610efcdec7e47be830214a8805149deba6762",
            "0862f4708b4b83c491a1061fa4d58f3b49e593d68007fac2247dc3bee254f519",
        ],
    ),
    "text": (
        "TextBatch",
        [
            "06c4e1291a4bd8e8242e2ea8a49b3f2e7d77f0534dc09ff478bfb05ce942e9d5",
            "58ad019737e0583ed664d105b3845e3b3dfcfd324adbc874421d95f611b64bbe",
            "aede74234867861c296963f97a81b789ea60f9b7687dc46676595619198ce74f",
        ],
    ),
    "vision_language": (
        "VisionLanguageBatch",
        [
            "72e009224060f7f86365bf20fcbb33b7a00ce293f5f0c70a30a970e19523b76a",
            "fb74de631fdb9ca45e65faab4f39382c5b602cc19cdeae0dcbbaa210bb8a66df",
            "a8aba5da4dd16fb93d1ca131ee16a6e12668ddbeee8a1fcef586fa7961b367cb",
            "75823a6248c38c51f277c93ec5be80a64b1fb11a31ebd44108b01d2e8f16c11f",
            "b973bd755f72fa76c51e78d4b30868e05daef04a4338052fac0402bf01b97331",
            "528175b1c816048ad4591764ebfaf8410570cf42f1fd7e387984ce468ca786bc",
            "f33cdc78f6757d3ea270c18ccf22365a55479788c227d7998c4dc19c1e303d12",
            "d255fa863917643f1a030bea3f859cbdf96aaab7dc4e83953c76f6bb1f77c7b0",
        ],
    ),
}
#: a multimodal batch of one modality digests as that modality's own batch does
RECORDED["multimodal_audio"] = ("MultimodalBatch", RECORDED["audio_text"][1])
RECORDED["multimodal_image"] = ("MultimodalBatch", RECORDED["image_text"][1])


def first_batches(make_encoder, make_dataset, one_pass, name: str) -> list:
    kind, sections, data = ENCODERS[name]
    path = make_dataset(data, n=8)
    return one_pass(make_encoder(kind, **sections), path, batch_size=4)[:2]


@pytest.mark.parametrize("name", sorted(ENCODERS))
def test_an_encoders_batches_digest_as_recorded(make_encoder, make_dataset, one_pass, name):
    batches = first_batches(make_encoder, make_dataset, one_pass, name)
    kind, digests = RECORDED[name]
    assert type(batches[0]).__name__ == kind
    assert [d for b in batches for d in row_digests(b)] == digests
