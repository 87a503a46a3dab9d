"""What the CLI writes, and only that: output into a pipe whose reader left (``| head -1``) ends
quietly; a third-party library's log lines never precede our one-line error; validation on a
machine without CUDA does not ask for pinned memory (torch's warning at every pass)."""

from __future__ import annotations

import os
import subprocess
import warnings

import pytest
import yaml

from energon_platform import cli
from energon_platform.config import load_config
from energon_platform.loader.train_loader import build_val_loader
from tests.helpers import REPO
from tests.helpers.cli import cli_argv, run_cli
from tests.helpers.run_configs import run_config, write_config


@pytest.fixture(scope="module")
def config_file(coco, tmp_path_factory):
    path = tmp_path_factory.mktemp("cfg") / "run.yaml"
    train = {"steps": 2, "out": str(path.parent / "out")}
    return write_config(path, run_config(coco, train=train))


def into_closed_pipe(*argv, cwd=None) -> subprocess.CompletedProcess:
    """Run the CLI with its stdout a pipe whose reading end is closed before it writes anything
    (what ``| head -1`` leaves once head has its line; closed first, so every write fails)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            cli_argv(*argv),
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=300,
            cwd=cwd,
        )
    finally:
        os.close(write_end)


def test_trace_into_a_closed_pipe_ends_quietly(config_file):
    r = into_closed_pipe("trace", "--config", config_file, "--steps", "1:3")
    assert r.returncode == 141 and r.stderr == "", (r.returncode, r.stderr[-2000:])


def test_convert_into_a_closed_pipe_ends_quietly_with_its_output_written(tmp_path):
    out = tmp_path / "docs"
    r = into_closed_pipe(
        "convert",
        "text",
        "--manifest",
        REPO / "data/text_mini/documents.jsonl",
        "--id-column",
        "id",
        "--out",
        out,
        "--no-progress",
    )
    assert r.returncode == 141 and r.stderr == "", (r.returncode, r.stderr[-2000:])
    assert (out / "report.json").is_file() and (out / ".nv-meta" / ".info.json").is_file()


def test_a_broken_pipe_that_is_not_stdout_is_not_hidden(monkeypatch, capfd):
    def broken(args):
        raise BrokenPipeError("a worker's pipe")

    monkeypatch.setattr(cli.data, "cmd_info", broken)
    with pytest.raises(BrokenPipeError, match="a worker's pipe"):
        cli.main(["info", "anything"])


def test_a_storage_error_is_our_one_line_without_the_storage_library_log(s3, coco, tmp_path):
    from converters.remote import upload_dataset

    url = s3.url(f"cut-shards-{tmp_path.name}")
    upload_dataset(coco, url)
    # every shard cut short: the first read fails
    for shard in sorted((coco / "train").glob("*.tar")):
        s3.client().put_object(
            Bucket=s3.bucket,
            Key=f"{url.split('/', 3)[3]}/train/{shard.name}",
            Body=shard.read_bytes()[:3000],
        )
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(run_config(url)))
    r = run_cli(
        "train",
        "--config",
        config,
        "--out",
        tmp_path / "out",
        "--steps",
        "1",
        "--quiet",
        timeout=300,
    )
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-3000:]
    assert (
        lines[0].startswith("energon-platform train: error: msc://") and "train/shard-" in lines[0]
    )


def test_validation_without_cuda_asks_for_no_pinned_memory(coco):
    if __import__("torch").cuda.is_available():
        pytest.skip("with CUDA, pinned memory is wanted")
    val = build_val_loader(load_config(run_config(coco)), batch_size=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert next(iter(val)) is not None
