#!/usr/bin/env python
"""The main job end to end on the embedded default data (what `make demo` runs:
``python -m scripts.demo --out out/demo``, from the repository root).

1. convert the embedded COCO-style, LibriSpeech-style, video and 3D corpora into Energon-ready shards;
2. show one decoded, augmented batch per modality (image-text, packed text, audio-text, video-text,
   point cloud-text) and draw contact sheets of video clips (``preview-video.png``) and of point
   clouds, three views each (``preview-3d.png``);
3. train the reference model on a three-modality blend (``configs/blend_demo.yaml``: image-text,
   audio-text and text-only, an Energon metadataset), kill it with SIGKILL in the middle of a step,
   resume it, and check that every step after the resume matches an uninterrupted run bit for bit;
4. a loss spike: a short run with junk planted into two documents of one step, its spike and
   samples found (``spikes``), the samples excluded from that step on (``spikes --exclude-from``),
   the run replayed from the checkpoint before without them (``replay``), and the run report of
   both (``report.html``: the spike, its samples as the model sees them, the replayed loss);
5. online data mixing: a short run of the blend whose weights follow each dataset's loss
   (``loader.blend_adapt``), its weights at the first and last step, and its report (weights over
   time beside the per-dataset losses).

``--out DIR`` follows the output rule (`storage.outputs`) before stage 1: the demo writes into a
new or empty folder, writing its mark (``demo.json``) there first, or into a folder its mark says
an earlier demo made (a rerun); any other folder, and the file system's root, the home folder or
a repository's root, is refused in one line, exit status 2, with nothing written.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: the demo's mark, written first into the folder it fills: a rerun there goes ahead
MARK = "demo.json"
MARK_CONTENT = {"written_by": "scripts/demo.py"}


def is_demo(folder: Path) -> bool:
    """Whether ``folder`` holds the demo's `MARK` (an earlier demo made it)."""
    try:
        mark = json.loads((folder / MARK).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(mark, dict) and mark.get("written_by") == MARK_CONTENT["written_by"]


def claim_out(out: Path) -> Path:
    """Make ``out`` the demo's folder before any stage: `storage.outputs.check_folder` refuses
    (`storage.outputs.OutputError`, one line, nothing written) a folder that is not new, empty
    or marked by an earlier demo, the file system's root, the home folder, a repository's root,
    and a folder in the embedded corpora or configs it reads; then the mark is written first
    (a rerun keeps it). Returns ``out``."""
    from storage.outputs import check_folder, write_atomic

    check_folder(out, is_demo, "demo", overwrite=True, inputs=(REPO / "data", REPO / "configs"))
    if not is_demo(out):
        with write_atomic(out / MARK) as tmp:
            tmp.write_text(json.dumps(MARK_CONTENT) + "\n")
    return out


def ep(*args: str, stdout: Path | None = None) -> None:
    """``energon-platform ARGS`` in this process (with what it planted), printed as typed;
    ``stdout``: its output goes to that file."""
    from energon_platform import cli

    print("$ energon-platform " + " ".join(args) + (f" > {stdout}" if stdout else ""), flush=True)
    with contextlib.ExitStack() as stack:
        if stdout:
            stack.enter_context(contextlib.redirect_stdout(stack.enter_context(open(stdout, "w"))))
        status = cli.main(list(args))
    if status:
        sys.exit(status)


def sh(*args: str) -> None:
    print("$ energon-platform " + " ".join(args), flush=True)
    r = subprocess.run([sys.executable, "-m", "energon_platform", *args], cwd=REPO)
    if r.returncode != 0:
        sys.exit(r.returncode)


def show_batch(title: str, data: Path, encoder, global_batch: int) -> None:
    from energon_platform.config import load_config
    from energon_platform.loader.train_loader import TrainLoader

    loader = TrainLoader(
        load_config(
            {
                "data": {"path": str(data)},
                "encoder": encoder,
                "loader": {"global_batch_size": global_batch, "num_workers": 0},
            }
        )
    )
    b = next(loader)
    print(f"\n== {title}: one batch from {data.name} ==")
    for name in (
        "images",
        "features",
        "feature_lengths",
        "videos",
        "num_frames",
        "points",
        "tokens",
        "labels",
        "loss_mask",
        "position_ids",
        "cu_seqlens",
    ):
        t = getattr(b, name, None)
        if t is not None:
            print(f"  {name:16s} {str(tuple(t.shape)):18s} {str(t.dtype):14s}")
    tok = loader.encoder.tokenizer
    print(f"  keys             {b.keys[:4]}{' ...' if len(b.keys) > 4 else ''}")
    print(f"  documents/row    {b.num_docs.tolist()}")
    print(f"  row 0 decoded    {tok.decode(b.tokens[0][: int(b.doc_lengths[0])])!r}")


def show_vlm_batch(title: str, data: Path, encoder: str, global_batch: int) -> None:
    """One micro-batch as Megatron-LM's multimodal get_batch receives it from our provider."""
    from energon_platform.config import load_config
    from energon_platform.integrations.megatron import make_provider, megatron_requirements

    cfg = load_config(
        {
            "data": {"path": str(data)},
            "encoder": encoder,
            "loader": {"global_batch_size": global_batch, "num_workers": 0},
        }
    )
    train = make_provider(cfg, dp_rank=0, dp_size=1, build_valid=False)(None)[0]
    d, b = next(train), train.last_batch
    train.close()
    req = megatron_requirements(cfg)
    print(
        f"\n== {title}: one Megatron micro-batch from {data.name} (image_token_index {train.image_token_index}, "
        f"{req['tokens_per_tile']} embeddings per tile) =="
    )
    for name in ("tokens", "labels", "imgs", "num_tiles", "cu_lengths", "max_lengths"):
        print(f"  {name:16s} {str(tuple(d[name].shape)):18s} {str(d[name].dtype):14s}")
    tok = train.loader.encoder.tokenizer.hf
    row = b.tokens[0][: int(b.doc_lengths[0])]
    print(
        f"  num_tiles        {b.num_tiles.tolist()} (per image), images/doc {b.num_images.tolist()}"
    )
    print(f"  row 0            {tok.decode(row)!r}")
    print(f"  loss on          {tok.decode(b.labels[0][b.loss_mask[0] > 0])!r}")


def show_balance(blend: Path, out: Path, steps: int = 4) -> None:
    """``loader.balance: attention`` on the packed blend, as 2 data-parallel ranks would see it:
    every micro-batch the same shape, no sample twice in a global batch, little padding. A blend
    this small (a few hundred short documents) leaves the ranks' costs further apart than a large
    one does: ``python -m scripts.bench.balance --sections demo balance`` measures both."""
    from energon_platform.config import load_config
    from energon_platform.loader.train_loader import TrainLoader

    cfg = load_config(
        {
            "data": {"path": str(blend), "val_split": None},
            "encoder": str(REPO / "configs/encoders/multimodal_packed.yaml"),
            "loader": {
                "global_batch_size": 8,
                "micro_batch_size": 2,
                "num_workers": 0,
                "seed": 1,
                "balance": "attention",
                "length_cache": str(out / "lengths"),
            },
        }
    )
    ranks = [TrainLoader(cfg, rank=r, world_size=2) for r in range(2)]
    print(
        f"\n-- balanced packing (balance: attention), 2 ranks x {ranks[0].accumulation} micro-batches --"
    )
    for step in range(steps):
        batches = [next(ld) for ld in ranks for _ in range(ld.accumulation)]
        shapes, keys = (
            {tuple(b.tokens.shape) for b in batches},
            [k for b in batches for k in b.keys],
        )
        stats = ranks[0].balance_stats(step)
        print(
            f"  step {step}: shapes {sorted(shapes)}  max/mean rank cost {stats['rank_cost']:.3f}  "
            f"padding {stats['padding']:.1%}  samples {stats['samples']} ({len(set(keys))} distinct)  "
            f"carried {stats['carried']}"
        )
    print(
        "  (a blend this small balances less evenly than a large one: scripts/bench/balance/ measures both)"
    )
    for ld in ranks:
        ld.close()


def _blend_file(out: Path, coco: Path, speech: Path, text: Path) -> Path:
    """``configs/blend_demo.yaml`` pointed at this demo's shards (it names ``out/demo/...``)."""
    import yaml

    mds = yaml.safe_load((REPO / "configs/blend_demo.yaml").read_text())
    for entry, path in zip(mds["splits"]["train"]["blend"], (coco, speech, text)):
        entry["path"] = str(path)
    mds["splits"]["val"]["blend"][0]["path"] = str(coco)
    blend = out / "blend.yaml"
    blend.write_text(yaml.safe_dump(mds, sort_keys=False))
    return blend


def spike_loop(out: Path, coco: Path) -> None:
    """A 16-step run on ``coco`` whose step ``PLANTED_STEP`` holds two documents made junk (their
    targets replaced by one token weighted 10x: scripts/planted_spike.py): its spike and
    samples found, the samples excluded from that step on, the run replayed from the checkpoint
    before, and ``out/report.html`` drawn. The junk stays planted in this process, for the
    replay too: only the exclusions keep it out."""
    from scripts.planted_spike import PLANTED_STEP, plant, planted_keys, write_config

    base = out / "spike"
    base.mkdir(parents=True, exist_ok=True)
    config = str(write_config(base / "run.yaml", coco))
    keys = planted_keys(Path(config))
    plant(None, set(keys))
    print(f"(documents {' and '.join(keys)} of step {PLANTED_STEP} are junk wherever trained)")
    run, replayed, rules = str(base / "run"), str(base / "replay"), base / "rules.yaml"
    shutil.rmtree(run, ignore_errors=True)
    ep("train", "--config", config, "--out", run, "--quiet")
    ep("spikes", "--run", run, "--config", config, "--top", "3")
    step = str(PLANTED_STEP)
    ep(
        "spikes",
        "--run",
        run,
        "--config",
        config,
        "--exclude-from",
        step,
        "--top",
        "2",
        stdout=rules,
    )
    ep(
        "replay",
        *("--run", run, "--config", config, "--from", step, "--steps", "8"),
        *("--set", f"loader.exclude=@{rules}", "--out", replayed, "--overwrite"),
    )
    report = str(out / "report.html")
    ep("report", "--run", run, "--compare", replayed, "--config", config, "--out", report)


def mixing_run(out: Path, blend: Path, steps: int = 16) -> Path:
    """``steps`` steps of ``configs/train_blend.yaml`` on ``blend`` with ``loader.blend_adapt`` as
    a run config writes it (``loss_ratio``: weight to the datasets whose loss still falls); prints
    the weights of its first and last step and draws ``out/mixing/report.html``. Returns the run."""
    import json

    run = out / "mixing"
    shutil.rmtree(run, ignore_errors=True)
    ep(
        "train",
        *("--config", "configs/train_blend.yaml", "--set", f"data.path={blend}"),
        *("--set", "loader.blend_adapt={method: loss_ratio, every: 2, lag: 2}"),
        *("--set", f"train.steps={steps}", "--out", str(run), "--quiet"),
    )
    rows = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    for row in (rows[0], rows[-1]):
        shares = "  ".join(f"{name} {w:.3f}" for name, w in row["blend_weights"].items())
        print(f"  step {row['step']:3d}  weights  {shares}")
    ep("report", "--run", str(run), "--out", str(run / "report.html"))
    return run


def main() -> int:
    ap = argparse.ArgumentParser(
        prog="python -m scripts.demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--out",
        default="out/demo",
        help="where shards and runs go (default out/demo): a new or empty folder, or one an "
        "earlier demo made (its demo.json); any other is refused before stage 1",
    )
    ap.add_argument(
        "--steps", type=int, default=30, help="training steps of the resume check (default 30)"
    )
    args = ap.parse_args()
    from storage.outputs import OutputError

    try:
        out = claim_out((REPO / args.out).resolve())
    except OutputError as e:
        print(f"demo: error: {e}", file=sys.stderr)
        return 2
    coco, speech, video, text = out / "coco", out / "librispeech", out / "video", out / "text"

    print("== 1. convert the embedded corpora ==", flush=True)
    sh(
        "convert",
        "coco",
        "--annotations",
        "data/coco_mini/captions.json",
        "--images",
        "data/coco_mini/images",
        "--out",
        str(coco),
        "--samples-per-shard",
        "64",
        "--val-fraction",
        "0.1",
        "--workers",
        "2",
    )
    sh(
        "convert",
        "librispeech",
        "--root",
        "data/librispeech_mini",
        "--out",
        str(speech),
        "--samples-per-shard",
        "16",
        "--val-fraction",
        "0.1",
        "--workers",
        "2",
    )
    sh(
        "convert",
        "video",
        "--root",
        "data/video_mini/clips",
        "--out",
        str(video),
        "--samples-per-shard",
        "16",
        "--val-fraction",
        "0.1",
        "--workers",
        "2",
    )
    sh(
        "convert",
        "3d",
        "--root",
        "data/mesh_mini/shapes",
        "--out",
        str(out / "shapes"),
        "--samples-per-shard",
        "16",
    )
    sh(
        "convert",
        "text",
        "--manifest",
        "data/text_mini/documents.jsonl",
        "--id-column",
        "id",
        "--out",
        str(text),
        "--samples-per-shard",
        "32",
    )
    sh(
        "convert",
        "llava",
        "--json",
        "data/coco_mini/conversations.json",
        "--images",
        "data/coco_mini/images",
        "--out",
        str(out / "conversations"),
        "--samples-per-shard",
        "16",
    )
    sh("info", str(coco))

    print("\n== 2. task encoders: one augmented batch per modality ==", flush=True)
    show_batch("image-text", coco, str(REPO / "configs/encoders/image_text_small.yaml"), 4)
    show_batch(
        "text, packed",
        coco,
        {
            "encoder": "text",
            "text": {"seq_len": 64},
            "packing": {"enabled": True, "buffer_size": 16},
        },
        2,
    )
    show_batch("audio-text", speech, str(REPO / "configs/encoders/audio_text.yaml"), 2)
    show_batch("video-text", video, str(REPO / "configs/encoders/video_text_small.yaml"), 2)
    show_vlm_batch(
        "vision-language captions, tiled",
        coco,
        str(REPO / "configs/encoders/image_text_vlm_small.yaml"),
        2,
    )
    show_vlm_batch(
        "conversations, tiled",
        out / "conversations",
        str(REPO / "configs/encoders/conversation_small.yaml"),
        2,
    )
    show_batch(
        "point cloud-text", out / "shapes", str(REPO / "configs/encoders/pointcloud_text.yaml"), 2
    )
    sh(
        "preview",
        str(out / "shapes"),
        "--encoder",
        str(REPO / "configs/encoders/pointcloud_text.yaml"),
        "--n",
        "8",
        "--out",
        str(out / "preview-3d.png"),
    )
    sh(
        "preview",
        str(video),
        "--encoder",
        str(REPO / "configs/encoders/video_text.yaml"),
        "--n",
        "8",
        "--out",
        str(out / "preview-video.png"),
    )

    blend = _blend_file(out, coco, speech, text)
    show_batch("three-modality blend", blend, str(REPO / "configs/encoders/multimodal.yaml"), 8)
    show_balance(blend, out)

    print("\n== 3. train on the blend, SIGKILL mid-step, resume, compare ==", flush=True)
    kill_at = max(2, args.steps // 2 + 2)
    sh(
        "check-resume",
        "--config",
        "configs/train_blend.yaml",
        "--set",
        f"data.path={blend}",
        "--steps",
        str(args.steps),
        "--kill-at",
        str(kill_at),
        "--out",
        str(out / "check-resume"),
    )

    print("\n== 4. a loss spike: find it, skip its samples, replay, report ==", flush=True)
    spike_loop(out, coco)

    print("\n== 5. online data mixing: weights that follow the per-dataset loss ==", flush=True)
    mixing_run(out, blend)
    return 0


if __name__ == "__main__":
    sys.exit(main())
