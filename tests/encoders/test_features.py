"""Cost features (:mod:`task_encoders.features`): names outside ``FEATURES`` are refused wherever a
vector is built. (That every encoder's three views agree is checked with the lengths, in
``tests/encoders/test_lengths.py``.)"""

from __future__ import annotations

import pytest

from task_encoders.features import FEATURES, features, summed, text_features


def test_a_full_vector_has_every_feature_in_order():
    assert list(features(points=3)) == list(FEATURES)
    assert text_features(5) == features(samples=1, llm_tokens=5, llm_attention=25)
    assert summed([text_features(2), features(points=3)]) == features(
        samples=1, llm_tokens=2, llm_attention=4, points=3
    )


def test_unknown_feature_names_are_refused():
    with pytest.raises(KeyError, match="unknown cost feature.*'frames'"):
        features(frames=1)
    with pytest.raises(KeyError, match="unknown cost feature.*'frames'"):
        summed([text_features(2), {"frames": 1}])


def test_an_encoder_counting_its_work_as_an_unknown_feature_is_refused():
    from task_encoders.documents import DocumentTaskEncoder

    with pytest.raises(TypeError, match=r"Clips\.work_feature is 'frames', not a cost feature"):

        class Clips(DocumentTaskEncoder):
            work_feature = "frames"


def test_batch_features_refuse_an_unknown_media_feature(tokenizer_dir):
    from task_encoders.documents import EncodedDoc
    from task_encoders.text import TextTaskEncoder

    class Misnamed(TextTaskEncoder):
        def batch_media_features(self, batch):
            return {"frames": 1.0}

    encoder = Misnamed({"text": {"seq_len": 16}})
    doc = EncodedDoc(
        __key__="k", __restore_key__=(), tokens=encoder.tokenizer.encode("a cat"), media={}
    )
    with pytest.raises(KeyError, match="unknown cost feature.*'frames'"):
        encoder.batch_features(encoder.batch([doc]))
