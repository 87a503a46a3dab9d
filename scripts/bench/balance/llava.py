"""The ``llava`` section: ``calibrate`` of megatron-core's own ``LLaVAModel``."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from scripts.bench.balance.common import CALIBRATION_KEYS, REPO, target_line
from scripts.bench.balance.measured import calibration_targets, fit_summary

#: ``calibrate --model`` of megatron-core's LLaVAModel (section ``llava``)
LLAVA_FACTORY = "energon_platform.integrations.megatron.llava:calibration_model"


#: the encoder the ``llava`` section calibrates on: the small vision-language encoder with 64-pixel
#: tiles (64 patches of 8 pixels each through the vision tower), 1-5 per image, rows of 512
LLAVA_ENCODER = REPO / "configs/encoders/image_text_vlm_small.yaml"


LLAVA_ENCODER_CHANGES = {"vision": {"image_size": 64}, "text": {"seq_len": 512}}


#: the ``llava`` section's vision tower (`tiny_llava`'s sizes): as in LLaVA-class models with a
#: large ViT, the tiles take a real share of a step's time (about half here). With the factory's
#: default (1 layer of 32) they take about 1% of it, and a fit has little but noise to explain.
LLAVA_VISION = {"vision_layers": 8, "vision_hidden": 256}


def llava_section(args) -> dict:
    """``llava``: ``calibrate`` of megatron-core's own ``LLaVAModel`` (``LLAVA_FACTORY``: a tiny
    model sized from the encoder, as Megatron's ``get_batch`` hands it the batches) on
    micro-batches of ``--llava-batch`` samples of the embedded COCO captions through the small
    vision-language encoder (``LLAVA_ENCODER`` with ``LLAVA_ENCODER_CHANGES``), converted into a
    temporary folder; the vision tower of ``LLAVA_VISION``; one thread, ``--calibrate-batches``
    micro-batches, the least of 3 rounds. Megatron's rows have a fixed length, so the language
    model's work is the same for every micro-batch and the tiles make the difference."""
    import functools
    import tempfile

    import torch
    import yaml

    from energon_platform.config import load_config
    from energon_platform.integrations.megatron.llava import calibration_model
    from energon_platform.training.calibrate import calibrate_run
    from scripts.bench.data import coco_dataset

    threads = torch.get_num_threads()
    with tempfile.TemporaryDirectory(prefix="bench-balance-llava-") as tmp:
        base = Path(tmp)
        config = base / "run.yaml"
        loader = {"global_batch_size": args.llava_batch, "num_workers": 0, "seed": 1234}
        encoder = yaml.safe_load(LLAVA_ENCODER.read_text())
        for group, changes in LLAVA_ENCODER_CHANGES.items():
            encoder[group] = {**encoder[group], **changes}
        config.write_text(
            yaml.safe_dump(
                {
                    "data": {"path": str(coco_dataset(base)), "val_split": None},
                    "encoder": encoder,
                    "loader": loader,
                }
            )
        )
        torch.set_num_threads(1)
        t = time.perf_counter()
        try:
            report = calibrate_run(
                load_config(str(config)),
                functools.partial(calibration_model, **LLAVA_VISION),
                model_name=LLAVA_FACTORY,
                micro_batches=args.calibrate_batches,
                repeats=3,
                progress=False,
            )
        finally:
            torch.set_num_threads(threads)
        print(f"  [calibrate LLaVAModel: {time.perf_counter() - t:.1f} s]", file=sys.stderr)
    calibration = {k: report[k] for k in CALIBRATION_KEYS}
    return {
        "model": LLAVA_FACTORY,
        "encoder": str(LLAVA_ENCODER.relative_to(REPO)),
        "encoder_changes": LLAVA_ENCODER_CHANGES,
        "vision": LLAVA_VISION,
        "micro_batch_size": args.llava_batch,
        "calibration": calibration,
        "targets": calibration_targets(calibration, "LLaVAModel"),
    }


def report_llava(section: dict, args) -> list[str]:
    c = section["calibration"]
    lines = [
        f"llava: megatron-core LLaVAModel ({section['model']}, vision tower "
        f"{section['vision']}) on micro-batches of {section['micro_batch_size']} samples of the "
        f"embedded COCO captions, encoder {section['encoder']} with {section['encoder_changes']}",
        f"calibration on {c['micro_batches']} micro-batches: " + fit_summary(c),
    ]
    for t in section["targets"]:
        lines.append(target_line(t, 60))
    return lines
