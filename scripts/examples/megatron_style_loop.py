"""A Megatron-LM-style training loop on energon-platform's provider
(``energon_platform.integrations.megatron``), making Megatron's calls in Megatron's order:

1. ``--load``: read ``latest_checkpointed_iteration.txt``, load that iteration's
   ``iter_NNNNNNN/mp_rank_00/model_optim_rng.pt``; ``args.iteration`` is then that iteration.
2. build the data: ``make_provider(..., dataloader_save=..., restore_iteration=args.iteration if
   --load else None)`` and ``train_iter, valid, test = provider(None)`` (``--dataloader-type
   external``).
3. each iteration: ``next(train_iter)`` once per micro-batch (``get_num_microbatches()``),
   forward/backward, optimizer step, then ``training_log``'s line (``--log-interval 1``); and a
   ``StepLog`` row in ``SAVE/steps.jsonl``: the iteration's keys (every data-parallel rank's
   micro-batches, in rank order), each key's own loss (``sample_losses``, from the provider's
   :func:`sample_losses` on the per-token loss) and the lm loss, the global token mean (the
   sample losses' mean weighted by their target counts). Each micro-batch's sample losses also go
   to ``train_iter.report_losses`` (what Megatron's ``loss_func`` would call, with
   ``group=parallel_state.get_data_parallel_group()``; here the default group is the
   data-parallel one): the iteration's reach the loader with its last micro-batch, before the
   checkpoint: online mixing's input (``loader.blend_adapt``), a no-op without it.
4. every ``--save-interval`` iterations, ``save_checkpoint``: the model file, the data loader
   state (``save_dataloader_state``), then the tracker file.

    python scripts/examples/megatron_style_loop.py --config run.yaml --save OUT --train-iters 12 [--load OUT]

Also under ``torchrun`` (gloo; one data-parallel rank per process). ``--skip-loader-restore``
breaks the resume on purpose (model and optimizer restored, the data starts over).
"""

import argparse
import os
import time
from datetime import datetime
from pathlib import Path

import torch
import torch.distributed as dist
from tiny_model import TinyModel, token_losses

from energon_platform import StepLog, build_encoder, load_config, record_run
from energon_platform.integrations.megatron import (
    make_provider,
    sample_losses,
    save_dataloader_state,
)

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("--config", required=True)
p.add_argument("--train-iters", type=int, required=True)
p.add_argument("--save", required=True)
p.add_argument("--load")
p.add_argument("--dataloader-save", help="default: --save")
p.add_argument("--save-interval", type=int, default=2)
p.add_argument("--micro-batch-size", type=int, default=2)
p.add_argument("--global-batch-size", type=int, default=4)
p.add_argument("--lr", type=float, default=3e-3)
p.add_argument(
    "--skip-loader-restore", action="store_true", help="a broken resume, for the check to catch"
)
args = p.parse_args()
args.dataloader_save = args.dataloader_save or args.save

distributed = "RANK" in os.environ  # under torchrun
if distributed:
    dist.init_process_group("gloo")
dp_rank, dp_size = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)


def ckpt_file(root, iteration):
    return Path(root) / f"iter_{iteration:07d}" / "mp_rank_00" / "model_optim_rng.pt"


# 1. model and optimizer, loaded from the latest checkpoint with --load (setup_model_and_optimizer)
torch.manual_seed(0)
# Megatron's get_tokenizer()
vocab_size = build_encoder(load_config(args.config)).tokenizer.vocab_size
model = TinyModel(vocab_size)
ddp = torch.nn.parallel.DistributedDataParallel(model) if distributed else model
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
args.iteration = 0
tracker = Path(args.load or args.save) / "latest_checkpointed_iteration.txt"
if args.load and tracker.is_file():
    args.iteration = int(tracker.read_text())
    state = torch.load(ckpt_file(args.load, args.iteration), weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])

# 2. the data, restored at the iteration of the model checkpoint (build_train_valid_test_data_iterators)
restore = args.iteration if args.iteration and not args.skip_loader_restore else None
provider = make_provider(
    args.config,
    dp_rank=dp_rank,
    dp_size=dp_size,
    micro_batch_size=args.micro_batch_size,
    global_batch_size=args.global_batch_size,
    dataloader_save=args.dataloader_save,
    restore_iteration=restore,
    build_valid=False,
)
train_iter, _, _ = provider(None)


def all_reduce(t):
    if distributed:
        dist.all_reduce(t)
    return t


def gather(part):
    """Every data-parallel rank's ``part``, in rank order."""
    parts = [part] * dp_size
    if distributed:
        dist.all_gather_object(parts, part)
    return parts


# 3. train
log = StepLog(Path(args.save) / "steps.jsonl")
if dp_rank == 0:  # SAVE/run.yaml and run.json: how this run was made
    record_run(args.save, load_config(args.config), dp_size, resumed=args.iteration > 0)
iteration = args.iteration
while iteration < args.train_iters:
    t0 = time.perf_counter()
    # get_num_microbatches()
    micro_batches = [next(train_iter) for _ in range(train_iter.accumulation)]
    targets = all_reduce(sum((b["labels"][:, 1:] != -100).sum() for b in micro_batches).float())
    total, keys, losses = torch.zeros(()), [], []
    # Megatron's get_batch: labels shifted by one, -100 (IGNORE_INDEX) is no target
    for mb in micro_batches:
        labels = mb["labels"][:, 1:]
        output_tensor = token_losses(ddp(mb["tokens"], mb["imgs"]), labels, labels != -100)
        loss_sum = output_tensor.sum()
        (loss_sum * dp_size / targets).backward()  # DDP averages over ranks: the global token mean
        total += loss_sum.detach()
        mb_losses = sample_losses(mb, output_tensor).tolist()
        train_iter.report_losses(mb["__key__"], mb_losses)  # as in Megatron's loss_func
        keys += mb["__key__"]
        losses += mb_losses
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad()
    iteration += 1
    lm_loss = all_reduce(total) / targets
    parts = gather((keys, losses))
    log.write(
        iteration,
        lm_loss.item(),
        keys=[k for ks, _ in parts for k in ks],
        sample_losses=[v for _, vs in parts for v in vs],
    )
    if dp_rank == dp_size - 1:  # print_rank_last
        print(
            f" [{datetime.now().strftime('%Y-%m-%d %H:%M:%S.%f')}] iteration {iteration:8d}/{args.train_iters:8d} |"
            f" consumed samples: {iteration * args.global_batch_size:12d} |"
            f" elapsed time per iteration (ms): {(time.perf_counter() - t0) * 1000:.1f} |"
            f" learning rate: {args.lr:.6E} | global batch size: {args.global_batch_size:5d} |"
            f" lm loss: {lm_loss.item():.6E} | loss scale: 1.0 | grad norm: {grad_norm.item():.3f} |"
            f" number of skipped iterations:   0 | number of nan iterations:   0 |",
            flush=True,
        )

    # 4. save_checkpoint: model file, data loader state, then the tracker (each written atomically)
    if iteration % args.save_interval == 0 or iteration == args.train_iters:
        if dp_rank == 0:
            path = ckpt_file(args.save, iteration)
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save(
                {
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "iteration": iteration,
                },
                path.with_suffix(".tmp"),
            )
            os.replace(path.with_suffix(".tmp"), path)
        save_dataloader_state(train_iter, args.dataloader_save, iteration, dp_rank)
        if distributed:
            dist.barrier()
        if dp_rank == 0:
            tracker = Path(args.save) / "latest_checkpointed_iteration.txt"
            tracker.with_suffix(".tmp").write_text(str(iteration))
            os.replace(tracker.with_suffix(".tmp"), tracker)

log.close()
train_iter.close()
if distributed:
    dist.destroy_process_group()
