"""Bad data inside the loader: skipped, logged by key, counted; a flood stops with a clear error."""

import logging

import pytest

from task_encoders.skipping import TooManyBadSamples

BROKEN = (3, 10)


@pytest.fixture(scope="module")
def broken_images(make_dataset):
    return make_dataset("image_text", broken=BROKEN)


@pytest.fixture(scope="module")
def flood_images(make_dataset):
    return make_dataset("image_text", n=16, broken=range(2, 12))


def keys_of(batches):
    return sorted(k for b in batches for k in b.keys)


def test_undecodable_images_are_skipped_logged_and_counted(
    make_encoder, broken_images, one_pass, caplog
):
    encoder = make_encoder("image_text")
    with caplog.at_level(logging.WARNING, logger="task_encoders.skipping"):
        batches = one_pass(encoder, broken_images)
    assert keys_of(batches) == [f"{i:012d}" for i in range(24) if i not in BROKEN]
    assert (encoder.skip_policy.failures, encoder.skip_policy.successes) == (2, 22)
    logged = "\n".join(r.getMessage() for r in caplog.records)
    for i in BROKEN:
        assert f"skipped sample {i:012d} in train/shard-" in logged


def test_skipping_works_inside_worker_processes(make_encoder, broken_images, one_pass):
    batches = one_pass(make_encoder("image_text"), broken_images, num_workers=2)
    assert keys_of(batches) == [f"{i:012d}" for i in range(24) if i not in BROKEN]


def test_undecodable_audio_is_skipped(make_encoder, make_dataset, one_pass):
    encoder = make_encoder("audio_text")
    batches = one_pass(encoder, make_dataset("audio_text", n=6, broken=[2]))
    assert keys_of(batches) == [f"9001-1-{i:04d}" for i in range(6) if i != 2]
    assert encoder.skip_policy.failures == 1


@pytest.mark.parametrize(
    "errors, message",
    [
        (
            {"max_consecutive_failures": 4},
            "4 samples failed in a row (errors.max_consecutive_failures=4)",
        ),
        (
            {"max_skipped_fraction": 0.3, "fraction_after": 8},
            "of 8 samples failed (errors.max_skipped_fraction=0.3)",
        ),
    ],
)
def test_a_flood_of_bad_samples_is_a_clear_error(
    make_encoder, flood_images, one_pass, errors, message
):
    with pytest.raises(TooManyBadSamples, match="too many bad samples in one worker") as info:
        one_pass(make_encoder("image_text", errors=errors), flood_images)
    assert message in str(info.value) and "section errors" in str(info.value)


def test_a_flood_in_a_worker_process_reaches_the_main_process(make_encoder, flood_images, one_pass):
    with pytest.raises(Exception, match="errors.max_consecutive_failures=3"):
        one_pass(
            make_encoder("image_text", errors={"max_consecutive_failures": 3}),
            flood_images,
            num_workers=2,
        )
