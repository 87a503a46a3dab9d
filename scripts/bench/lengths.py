#!/usr/bin/env python3
"""What the length index of ``loader.balance`` costs: bytes per sample and build time per core.

Converts the embedded corpora (image-text, audio-text, text) into a temporary folder, builds each
one's length index (:mod:`energon_platform.loader.balance.lengths`) from scratch in one process under the
encoder ``loader.balance`` would use, and reports the index's bytes per sample, samples per
CPU-second, and what that means at 10^8 samples (GB on disk, core-hours to build). The alternative
it is compared with is decoding: the same samples fully loaded and encoded (``encode``), which is
what a length index built by decoding would cost.

It also times the lookup ``loader.balance: measured`` makes per sample in a run: a sample's lengths
and cost features at an epoch from its facts in the index (`SampleLengths.length_of`, the encoder's
``sample_length`` and ``sample_features``; its cache bypassed), in µs per sample over
`LOOKUP_EPOCHS` epochs (least of `LOOKUP_REPEATS` passes after one warm-up), against decoding and encoding the sample.

    .venv/bin/python -m scripts.bench.lengths [--json bench-lengths.json]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from scripts.bench.common import REPO, check_json_out, load_average, machine, write_json

CORPORA = (  # (dataset folder, convert kind, convert args, encoder config)
    (
        "coco_mini",
        "coco",
        {"annotations": "data/coco_mini/captions.json", "images": "data/coco_mini/images"},
        "configs/encoders/image_text_vlm_small_packed.yaml",
    ),
    (
        "librispeech_mini",
        "librispeech",
        {"root": "data/librispeech_mini"},
        "configs/encoders/audio_text.yaml",
    ),
    (
        "text_mini",
        "text",
        {
            "manifest": "data/text_mini/documents.jsonl",
            "text_column": "text",
            "id_column": "id",
            "fmt": None,
        },
        "configs/encoders/text_small.yaml",
    ),
)


def convert(base: Path) -> dict[str, Path]:
    from converters.convert import ConvertOptions, run_conversion

    out = {}
    for name, kind, args, _ in CORPORA:
        paths = {
            k: (str(REPO / v) if isinstance(v, str) and v.startswith("data/") else v)
            for k, v in args.items()
        }
        run_conversion(
            kind, paths, ConvertOptions(out=str(base / name), samples_per_shard=64, progress=False)
        )
        out[name] = base / name
    return out


#: Epochs the per-sample lookup is timed over (each epoch redraws a sample's seeded lengths).
LOOKUP_EPOCHS = 5
#: Timed passes of the lookup over every sample and epoch; the least is reported.
LOOKUP_REPEATS = 3


def lookup_us(index, encoder, n: int) -> float:
    """CPU µs per sample of the loader's lookup of a sample's lengths and cost features."""
    from energon_platform.loader.balance.costs import feature_work
    from energon_platform.loader.balance.lengths import SampleLengths

    lookup = SampleLengths(None, [index], encoder, [""], *feature_work(encoder))
    length_of = lookup.length_of.__wrapped__  # the lookup itself, not its cache of repeats
    seconds = []
    for _ in range(1 + LOOKUP_REPEATS):  # the first pass warms up and is not counted
        t = time.process_time()
        for epoch in range(LOOKUP_EPOCHS):
            for i in range(n):
                length_of(0, epoch, i)
        seconds.append(time.process_time() - t)
    return 1e6 * min(seconds[1:]) / (LOOKUP_EPOCHS * n)


def measure(path: Path, encoder_config: str, tmp: Path) -> dict:
    from energon_platform.loader.balance.length_store import build
    from energon_platform.loader.balance.lengths import LengthIndex
    from energon_platform.loader.fingerprint import encoder_digest
    from energon_platform.loader.source import SampleSource
    from task_encoders.registry import get_encoder

    source, encoder = SampleSource(str(path)), get_encoder(str(REPO / encoder_config))
    place = tmp / f"index-{path.name}"
    t = time.process_time()
    built = build(source, encoder, encoder_digest(encoder), place, workers=1, progress=False)
    index_cpu = time.process_time() - t
    index = LengthIndex(Path(built["folder"]))
    n = len(source)
    t = time.process_time()
    for i in range(n):  # the alternative: decode and encode every sample to learn its length
        sample = source[i]
        sample.__subflavors__ = {**(sample.__subflavors__ or {}), "epoch": 0}
        encoder.encode(sample)
    decode_cpu = time.process_time() - t
    per_sample = index.nbytes / n
    lookup = lookup_us(index, encoder, n)
    return {
        "dataset": path.name,
        "encoder": encoder_config,
        "samples": n,
        "bytes_per_sample": round(per_sample, 1),
        "index_samples_per_cpu_s": round(n / index_cpu),
        "decode_samples_per_cpu_s": round(n / decode_cpu),
        "speedup_vs_decoding": round(decode_cpu / index_cpu, 1),
        "lookup_us_per_sample": round(lookup, 1),
        "decode_us_per_sample": round(1e6 * decode_cpu / n, 1),
        "lookup_speedup_vs_decoding": round(1e6 * decode_cpu / n / lookup, 1),
        "at_1e8": {
            "gb": round(per_sample * 1e8 / 1e9, 2),
            "core_hours": round(1e8 * index_cpu / n / 3600, 1),
        },
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m scripts.bench.lengths",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args(argv)
    check_json_out(args.json)  # before any work: new, or a benchmark JSON
    load = load_average()
    with tempfile.TemporaryDirectory() as tmp:
        rows = [
            measure(path, enc, Path(tmp))
            for (name, _, _, enc), path in zip(CORPORA, convert(Path(tmp)).values())
        ]
    print(
        f"{'dataset':18} {'samples':>7} {'B/sample':>8} {'index/s/core':>12} {'decode/s/core':>13} "
        f"{'ratio':>6} {'1e8: GB':>8} {'1e8: core-h':>11} {'lookup us':>9} {'decode us':>9} "
        f"{'ratio':>6}"
    )
    for r in rows:
        print(
            f"{r['dataset']:18} {r['samples']:7d} {r['bytes_per_sample']:8.1f} {r['index_samples_per_cpu_s']:12d} "
            f"{r['decode_samples_per_cpu_s']:13d} {r['speedup_vs_decoding']:5.1f}x {r['at_1e8']['gb']:8.2f} "
            f"{r['at_1e8']['core_hours']:11.1f} {r['lookup_us_per_sample']:9.1f} "
            f"{r['decode_us_per_sample']:9.1f} {r['lookup_speedup_vs_decoding']:5.1f}x"
        )
    write_json(
        args.json,
        {
            "benchmark": "lengths",
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "machine": machine(),
            "load_average": {"before": load, "after": load_average()},
            "settings": {"lookup_epochs": LOOKUP_EPOCHS, "lookup_repeats": LOOKUP_REPEATS},
            "results": rows,
        },
        indent=2,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
