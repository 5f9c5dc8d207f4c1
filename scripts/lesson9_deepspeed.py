"""Lesson 9: lesson 3's DDP training with DeepSpeed's engine, ZeRO stage 0, 1, 2 or 3.

    make lesson9-deepspeed NPROC=2                      # prints, then runs, this command:
    torchrun --nproc-per-node=2 scripts/lesson9_deepspeed.py --zero-stage 2
    deepspeed --num_gpus 2 scripts/lesson9_deepspeed.py # or DeepSpeed's own launcher starts it

deepspeed.initialize() takes the model and the optimizer and returns its engine, which
does what DDP did (the gradients' all-reduce) and, from stage 1, what lesson 8's ZeRO did
(each rank steps a shard; from stage 2 it keeps only its shard's gradients; at stage 3 only
its shard of every parameter, gathered whole layer by layer for each forward and backward).
Two of its defaults would change lesson 3's training; the config below undoes them, and
--deepspeed-defaults keeps them: gradients clipped to norm 1.0 (GRADIENT_CLIPPING_DEFAULT in
deepspeed/runtime/constants.py), and from stage 1 a refusal of optimizers it has not tested
(engine.py, _do_optimizer_sanity_check). Its C++ operator for the CPU is built when `make
setup-lesson9` installs it. Its launcher adds --local_rank=N (parsed below) and, unlike
torchrun, leaves OMP_NUM_THREADS unset: on a CPU each worker's kernels then use every core
and sum in another order than lesson 3's, unless OMP_NUM_THREADS=1 is set.
At W = 2 it trains to lesson 3's very bits, at every stage; at W = 3 not quite: DDP
multiplies each gradient by 1/W as it copies it into its bucket and then sums (reducer.cpp,
mul_out); at stage 0 the engine sums and then multiplies by 1/W (deepspeed/runtime/engine.py,
allreduce_bucket), at stages 1-3 it divides by W and then sums (zero/stage_1_and_2.py,
average_tensor; comm/coalesced_collectives.py, reduce_scatter_coalesced). Scaling by 1/2 is
exact, by 1/3 is not, so the roundings differ in the last bit, a difference that the steps
after it then grow:
    diff scripts/lesson3_ddp.py scripts/lesson9_deepspeed.py
"""

import copy
import os
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler, Subset

from ddpcourse.cli import ArgumentParser, split_batch
from ddpcourse.data import DATASETS, NUM_CLASSES, load_datasets
from ddpcourse.models import create_model
from ddpcourse.report import summary_line
from ddpcourse.runtime import fail, needs_library, pick_device, world_of_one_unless_launched

needs_library("deepspeed", "make setup-lesson9")  # before importing it: one line
import deepspeed
from deepspeed.runtime.constants import GRADIENT_CLIPPING_DEFAULT

# The learning rate belongs to the GLOBAL batch: 0.1 for 256 samples per optimizer step.
# Linear scaling rule: change the global batch by a factor k and scale the rate by k too.
BASE_LR, BASE_BATCH = 0.1, 256


def parse_args():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", choices=DATASETS, default="digits")
    parser.add_argument("--data-dir", default="data", help="where cifar10 looks for its files")
    parser.add_argument("--image-size", type=int, default=None,
                        help="image side in pixels (default: 16 for digits, 32 for cifar10)")
    parser.add_argument("--model", default="test_resnet", help="a timm model name")
    parser.add_argument("--pretrained", action="store_true",
                        help="start from timm's pretrained weights (must be on this machine)")
    parser.add_argument("--epochs", type=int, default=8, help="0 measures start-up alone")
    parser.add_argument("--batch-size", type=int, default=None,
                        help=f"the global batch, all devices together (default {BASE_BATCH}, "
                             "rounded down to split over the processes)")
    parser.add_argument("--lr", type=float, default=None,
                        help=f"learning rate for the global batch (default {BASE_LR} x "
                             f"batch-size / {BASE_BATCH}: the linear scaling rule)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--zero-stage", type=int, choices=(0, 1, 2, 3), default=0,
                        help="0: DDP's work; 1: optimizer state sharded; 2: gradients too; "
                             "3: parameters too")
    parser.add_argument("--deepspeed-defaults", action="store_true",
                        help="keep its gradient clipping (1.0) and its refusal of torch's SGD")
    parser.add_argument("--local_rank", type=int, help="the deepspeed launcher's; LOCAL_RANK")
    parser.add_argument("--checkpoint", default=f"runs/{Path(__file__).stem}.pt")
    parser.add_argument("--timeout", type=float, default=120,
                        help="seconds a collective may wait for the other processes")
    args = parser.parse_args()
    if args.epochs < 0 or args.batch_size is not None and args.batch_size < 1:
        parser.error("--epochs must be >= 0 and --batch-size >= 1")
    return args


@torch.no_grad()
def evaluate(model, loader, device):
    """[correct predictions, samples seen] over `loader`, as a tensor on `device`."""
    model.eval()
    counts = torch.zeros(2, dtype=torch.float64, device=device)  # summed on the device
    for images, labels in loader:
        images, labels = images.to(device), labels.to(device)
        counts[0] += (model(images).argmax(1) == labels).sum()
        counts[1] += len(labels)
    return counts


def main():
    args = parse_args()
    started = time.perf_counter()

    world_of_one_unless_launched()
    rank = int(os.environ["RANK"])              # this process, 0 .. world_size - 1
    local_rank = int(os.environ["LOCAL_RANK"])  # its number on this node: picks the GPU
    world_size = int(os.environ["WORLD_SIZE"])  # processes in the job

    device, backend = pick_device(local_rank)  # cuda:LOCAL_RANK with nccl, else CPU with gloo
    if device.type == "cuda":
        torch.cuda.set_device(device)
    deepspeed.init_distributed(backend, timeout=timedelta(seconds=args.timeout))

    # The global batch stays what it was on one device; each process takes an equal share.
    # Left out, it is 256 rounded down to split (255 = 3 x 85); given, it must split exactly.
    try:  # args.batch_size becomes the global batch this run really trains with
        args.batch_size, batch_size, rounded = split_batch(args.batch_size, BASE_BATCH, world_size)
    except ValueError as mistake:  # every rank meets it: rank 0 says so, the others wait
        fail(str(mistake))

    train_set, val_set = load_datasets(args.dataset, args.data_dir, args.image_size)
    # Each process reads its own 1/world_size of the shuffled training set (set_epoch below).
    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, shuffle=True,
                                 seed=args.seed)
    train_loader = DataLoader(train_set, batch_size=batch_size, sampler=sampler)
    # Validation: every world_size-th image, no sampler padding: each one counted once.
    val_loader = DataLoader(Subset(val_set, range(rank, len(val_set), world_size)),
                            batch_size=batch_size)

    torch.manual_seed(args.seed)  # the same initial weights in every run
    model = create_model(args.model, NUM_CLASSES[args.dataset], args.pretrained).to(device)
    plain = copy.deepcopy(model)  # evaluated and saved: stage 3 keeps 1/W of each parameter
    lr = args.lr if args.lr is not None else BASE_LR * args.batch_size / BASE_BATCH
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4)
    # The engine copies rank 0's weights everywhere and averages gradients during backward.
    config = {"train_micro_batch_size_per_gpu": batch_size, "gradient_accumulation_steps": 1,
              "zero_optimization": {"stage": args.zero_stage}, "steps_per_print": 10**9}
    if not args.deepspeed_defaults:
        config["gradient_clipping"] = 0.0  # its default, 1.0, clips where lesson 3 does not
        config["zero_allow_untested_optimizer"] = True  # torch's SGD, refused from stage 1 without
    try:
        model, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer,
                                                      config=config)
    except AssertionError as refusal:  # every rank meets it: rank 0 says so, the others wait
        fail(f"DeepSpeed refuses: {refusal}")

    parameters = sum(p.numel() for p in plain.parameters())
    if rank == 0:  # rank 0 speaks for the job
        print(f"{args.model} ({parameters / 1e6:.2f} M parameters) on {args.dataset}: "
              f"{len(train_set)} training and {len(val_set)} validation images, "
              f"{world_size} process(es) on {device.type} with {backend}")
        print(f"global batch {args.batch_size} = {world_size} process(es) x {batch_size}, "
              f"lr {lr:g}{rounded}")
        print(f"ZeRO stage {args.zero_stage}, gradient clipping {model.gradient_clipping():g} "
              f"(DeepSpeed's default: {GRADIENT_CLIPPING_DEFAULT:g})")

    train_loss = val_acc = float("nan")
    train_seconds = trained = 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)  # a new shuffle every epoch, the same one on every rank
        model.train()
        tick = time.perf_counter()
        # Running sums stay on the device: .item() would make the CPU wait for the GPU at
        # every step. They are read once, when the epoch ends.
        stats = torch.zeros(3, dtype=torch.float64, device=device)  # loss sum, correct, seen
        for images, labels in train_loader:
            images, labels = images.to(device), labels.to(device)
            logits = model(images)
            loss = F.cross_entropy(logits, labels)
            model.backward(loss)  # the engine: backward, then the all-reduce
            model.step()  # the optimizer's step (its shard's, from stage 1), then zero_grad
            stats[0] += loss.detach() * len(labels)  # detach: no graph across the epoch
            stats[1] += (logits.argmax(1) == labels).sum()
            stats[2] += len(labels)
        dist.all_reduce(stats)  # sums over ranks: the loss and accuracy of the whole epoch
        loss_sum, correct, seen = stats.tolist()  # the epoch's one wait for the device
        train_seconds += time.perf_counter() - tick
        trained += int(seen)

        # Each rank's batches moved its own BatchNorm statistics: use rank 0's, as saved.
        for buffer in model.module.buffers():
            dist.broadcast(buffer, src=0)
        # Stage 3: every rank gathers each parameter whole (a collective), for the copy.
        with deepspeed.zero.GatheredParameters(list(model.module.parameters())):
            plain.load_state_dict(model.module.state_dict())
        # The plain model: its forward does no collectives, so shard sizes may differ.
        counts = evaluate(plain, val_loader, device)
        dist.all_reduce(counts)  # correct and seen, summed over the ranks' shards
        val_correct, val_seen = counts.tolist()
        train_loss, val_acc = loss_sum / seen, val_correct / val_seen
        if rank == 0:
            print(f"epoch {epoch + 1}/{args.epochs}  loss {train_loss:.4f}  "
                  f"train acc {correct / seen:.3f}  val acc {val_acc:.3f} "
                  f"({int(val_seen)} images)  {time.perf_counter() - tick:.1f} s")

    if rank == 0:  # one checkpoint, written once: every rank holds the same weights
        os.makedirs(os.path.dirname(args.checkpoint) or ".", exist_ok=True)
        torch.save({"model": plain.state_dict(), "args": vars(args)}, args.checkpoint)
        print(f"checkpoint: {args.checkpoint}")
        print(summary_line(world_size=world_size, batch_per_process=batch_size,
                           global_batch=args.batch_size, epochs=args.epochs,
                           train_loss=train_loss, val_acc=val_acc,
                           samples_per_s=round(trained / max(train_seconds, 1e-9)),
                           wall_s=round(time.perf_counter() - started, 2)))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
