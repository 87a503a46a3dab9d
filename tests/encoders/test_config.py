"""Encoder configs: YAML → validated dataclasses; every error names file, key and expectation."""

import shutil

import pytest
import yaml

from task_encoders.config_parser import ConfigError, to_plain
from task_encoders.registry import available, get_encoder
from tests.helpers import REPO

CONFIGS = sorted((REPO / "configs" / "encoders").glob("*.yaml"))


def write(tmp_path, text):
    path = tmp_path / "enc.yaml"
    path.write_text(text)
    return path


def expect_error(config, *fragments):
    with pytest.raises(ConfigError) as info:
        get_encoder(config)
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)
    return info.value


def test_builtin_encoders_are_registered():
    assert {"text", "image_text", "audio_text"} <= set(available())


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_configs_build(path, tokenizer_dir):
    data = yaml.safe_load(path.read_text())
    data.setdefault("text", {})["tokenizer"] = str(tokenizer_dir)
    encoder = get_encoder(data)
    assert encoder.name == data["encoder"] and encoder.seed == data.get("seed", 0)
    assert to_plain(encoder.config)["text"]["tokenizer"] == str(tokenizer_dir)


def test_unknown_transform_names_file_key_and_choices(tmp_path, tokenizer_dir):
    path = write(
        tmp_path,
        f"""
encoder: image_text
text: {{tokenizer: {tokenizer_dir}}}
image:
  transforms:
    - {{name: RandomResizedCrop, size: 32}}
    - {{name: RandomFlip}}
""",
    )
    error = expect_error(
        path,
        f"{path}: image.transforms[1].name: unknown transform 'RandomFlip'",
        "expected one of RandomResizedCrop, Resize, CenterCrop",
    )
    assert error.source == str(path) and error.key == "image.transforms[1].name"


def test_missing_tokenizer_dir(tmp_path):
    expect_error(
        write(tmp_path, "encoder: text\ntext: {tokenizer: no_such_dir}\n"),
        "text.tokenizer: no directory",
        "no_such_dir",
        "expected a local Hugging Face tokenizer directory",
    )


def test_relative_tokenizer_path_is_resolved_from_the_yaml_folder(tmp_path, tokenizer_dir):
    shutil.copytree(tokenizer_dir, tmp_path / "tok")
    encoder = get_encoder(write(tmp_path, "encoder: text\ntext: {tokenizer: tok, seq_len: 16}\n"))
    assert encoder.tokenizer.path == tmp_path / "tok"


@pytest.mark.parametrize(
    "section, fragments",
    [
        ({"text": {"seq_len": 3}}, ["text.seq_len: 3 is impossible", "from 4"]),
        (
            {
                "image": {
                    "transforms": [
                        {"name": "Resize", "size": 32},
                        {"name": "CenterCrop", "size": 48},
                    ]
                }
            },
            ["image.transforms[1].size: crop [48, 48] is larger than the [32, 32]"],
        ),
        (
            {"image": {"transforms": [{"name": "RandomCrop", "size": 8}]}},
            ["image.transforms[0]: RandomCrop on images of unknown size"],
        ),
        (
            {"image": {"transforms": [{"name": "RandomHorizontalFlip"}]}},
            ["image.transforms: the output size is not fixed"],
        ),
        (
            {"image": {"transforms": [{"name": "RandomResizedCrop", "size": 99999}]}},
            ["image.transforms[0].size", "1 to 4096"],
        ),
        (
            {
                "image": {
                    "transforms": [{"name": "RandomResizedCrop", "size": 16, "scale": [0.9, 0.1]}]
                }
            },
            ["scale: low 0.9 > high 0.1"],
        ),
        (
            {"image": {"transforms": [{"name": "RandomResizedCrop", "size": 16, "sise": 3}]}},
            ["transforms[0].sise: unknown parameter"],
        ),
        (
            {"image": {"transforms": [{"name": "Normalize", "mean": [0.5], "std": [1, 1, 1]}]}},
            ["transforms[0].mean", "3 numbers"],
        ),
        (
            {
                "image": {
                    "transforms": [{"name": "RandomResizedCrop", "size": 16}],
                    "eval_transforms": [{"name": "Resize", "size": [8, 8]}],
                }
            },
            ["image.eval_transforms: output size [8, 8]"],
        ),
        (
            {"packing": {"enabled": "yes"}},
            ["packing.enabled: got str 'yes' (expected true or false)"],
        ),
        ({"packing": {"buffer_size": 0}}, ["packing.buffer_size: got 0"]),
        ({"colour": 1}, ["colour: unknown key (expected one of encoder, module, seed"]),
        ({"errors": {"max_skipped_fraction": 2}}, ["errors.max_skipped_fraction: got 2.0"]),
    ],
)
def test_impossible_image_text_values(tokenizer_dir, section, fragments):
    config = {"encoder": "image_text", "text": {"tokenizer": str(tokenizer_dir)}}
    for key, value in section.items():
        config[key] = {**config.get(key, {}), **value} if isinstance(value, dict) else value
    expect_error(config, "<dict>: ", *fragments)


@pytest.mark.parametrize(
    "audio, fragment",
    [
        (
            {"n_mels": 300, "n_fft": 400},
            "audio.n_mels: got 300 (expected an integer from 1 to n_fft // 2 + 1 = 201)",
        ),
        ({"hop_length": 500}, "audio.hop_length: got 500"),
        ({"sample_rate": 10}, "audio.sample_rate: got 10"),
        (
            {"n_mels": 10, "spec_augment": {"freq_width": 20}},
            "audio.spec_augment.freq_width: 20 is wider than n_mels=10",
        ),
    ],
)
def test_impossible_audio_values(tokenizer_dir, audio, fragment):
    expect_error(
        {"encoder": "audio_text", "text": {"tokenizer": str(tokenizer_dir)}, "audio": audio},
        fragment,
    )


def test_unknown_encoder_module_and_bad_yaml(tmp_path, tokenizer_dir):
    expect_error(
        {"encoder": "smell"}, "encoder: unknown encoder 'smell' (expected one of", "image_text"
    )
    expect_error(
        {"encoder": "text", "module": "no.such.module"}, "module: cannot import 'no.such.module'"
    )
    expect_error(write(tmp_path, "encoder: [text\n"), "enc.yaml: not valid YAML")
    expect_error(write(tmp_path, "- text\n"), "top level is list")
    expect_error(tmp_path / "missing.yaml", "missing.yaml: file not found")


def test_section_keys_left_out_keep_the_encoders_defaults(tokenizer_dir):
    encoder = get_encoder(
        {
            "encoder": "text",
            "text": {"tokenizer": str(tokenizer_dir)},
            "packing": {"buffer_size": 64},
        }
    )
    # text packs by default
    assert encoder.config.packing.enabled and encoder.packing_buffer_size == 64
    assert encoder.config.text.seq_len == 128


def test_tokenizer_special_tokens_are_checked(tokenizer_dir):
    expect_error(
        {"encoder": "text", "text": {"tokenizer": str(tokenizer_dir), "bos_token": "<nope>"}},
        "text.bos_token: '<nope>' is not in the vocabulary",
    )
    encoder = get_encoder({"encoder": "text", "text": {"tokenizer": str(tokenizer_dir)}})
    assert (
        encoder.tokenizer.special.pad,
        encoder.tokenizer.special.bos,
        encoder.tokenizer.special.eos,
    ) == (0, 1, 2)


def test_encoder_class_refuses_a_config_for_another_encoder(tokenizer_dir):
    from task_encoders.image_text import ImageTextTaskEncoder

    with pytest.raises(ConfigError, match="encoder: 'text' given to ImageTextTaskEncoder"):
        ImageTextTaskEncoder({"encoder": "text", "text": {"tokenizer": str(tokenizer_dir)}})


def test_a_field_marked_with_choices_takes_the_names_its_registry_holds_when_parsed():
    import dataclasses

    from task_encoders.config_parser import CHOICES, At, parse

    registry = {"a": 1}

    @dataclasses.dataclass(frozen=True)
    class Section:
        method: str = dataclasses.field(default="a", metadata={CHOICES: lambda: registry})

    assert parse(Section, {"method": "a"}, At()).method == "a"
    with pytest.raises(ConfigError) as e:
        parse(Section, {"method": "b"}, At(source="run.yaml"))
    assert str(e.value) == "run.yaml: method: got 'b' (expected one of 'a')"
    registry["b"] = 2  # registered later: allowed from then on, listed in the error
    assert parse(Section, {"method": "b"}, At()).method == "b"
    with pytest.raises(ConfigError, match=r"got 5 \(expected one of 'a', 'b'\)$"):
        parse(Section, {"method": 5}, At())
