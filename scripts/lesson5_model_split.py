"""Lesson 5: a process that drives several devices: the model split over them, DDP across.

    make lesson5-split NPROC=2                       # prints, then runs, this command:
    torchrun --nproc-per-node=2 scripts/lesson5_model_split.py --devices-per-process 2

Lesson 1's second layout: every process drives k devices. Its model is cut into k stages,
stage i on device k x LOCAL_RANK + i, and the activations move from one device to the next
(model parallelism inside the process). DDP keeps the processes' copies in step as before,
but is created with device_ids=None: a module spread over several devices has no one device
for DDP to put its inputs on. The script trains the split model for a few steps and then the
same model, unsplit, from the same start on the same batches, and compares the losses.

On a machine without GPUs every stage is on the CPU: the same code, nothing moves, and the
two runs must agree to float rounding. With GPUs, each process needs k of them.
"""

import os
import time
from dataclasses import replace
from datetime import timedelta

os.environ.setdefault("MPLBACKEND", "Agg")  # draw to a file; no screen needed

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from ddpcourse.cli import ArgumentParser, split_batch
from ddpcourse.data import NUM_CLASSES, load_datasets
from ddpcourse.report import format_table, summary_line
from ddpcourse.runtime import fail, pick_device, world_of_one_unless_launched
from ddpcourse.topology import draw, layout

BASE_LR, BASE_BATCH = 0.1, 256


def parse_args():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices-per-process", "-k", type=int, default=2,
                        help="k: devices (and model stages) per process (default 2)")
    parser.add_argument("--steps", type=int, default=8, help="SGD steps of each run (default 8)")
    parser.add_argument("--batch-size", type=int, default=None,
                        help=f"the global batch (default {BASE_BATCH}, rounded down to split)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tolerance", type=float, default=1e-5,
                        help="largest relative loss difference that counts as the same")
    parser.add_argument("--picture", default="runs/lesson5_split_job.png",
                        help="where rank 0 saves the diagram of this job")
    parser.add_argument("--timeout", type=float, default=120,
                        help="seconds a collective may wait for the other processes")
    args = parser.parse_args()
    if not 1 <= args.devices_per_process <= 8:
        parser.error("--devices-per-process must be between 1 and 8")
    if args.steps < 1 or args.timeout <= 0 or args.batch_size is not None and args.batch_size < 1:
        parser.error("--steps and --batch-size must be at least 1, --timeout positive")
    return args


def layers(num_classes: int) -> list[nn.Module]:
    """A small CNN for 16 x 16 images, as a plain list of layers: it can be cut anywhere."""
    return [nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),      # 16 -> 8
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),     # 8 -> 4
            nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, num_classes)]


class Split(nn.Module):
    """The layers cut into len(devices) consecutive stages, stage i on devices[i]."""

    def __init__(self, layer_list: list[nn.Module], devices: list[torch.device]):
        super().__init__()
        k, n = len(devices), len(layer_list)
        cuts = [round(i * n / k) for i in range(k + 1)]  # k = 2: the first half, the second
        self.devices = devices
        bounds = zip(cuts[:-1], cuts[1:], devices, strict=True)
        self.stages = nn.ModuleList(nn.Sequential(*layer_list[a:b]).to(device)
                                    for a, b, device in bounds)

    def forward(self, x):
        for stage, device in zip(self.stages, self.devices, strict=True):
            x = stage(x.to(device))  # the activations move to the stage's device
        return x


def train(model, loader, sampler, optimizer, steps, devices, world_size):
    """`steps` SGD steps; the loss of each over the whole global batch (all ranks)."""
    losses, step, epoch = [], 0, 0
    while step < steps:
        sampler.set_epoch(epoch)
        for images, labels in loader:
            logits = model(images)                   # moved to the first stage inside
            loss = F.cross_entropy(logits, labels.to(devices[-1]))  # on the last stage's
            optimizer.zero_grad(set_to_none=True)
            loss.backward()                          # DDP all-reduces the gradients
            optimizer.step()
            total = loss.detach().double().to(devices[0]) * len(labels)  # the group's device
            dist.all_reduce(total)                   # the global batch's loss, same everywhere
            losses.append(total.item() / (len(labels) * world_size))
            step += 1
            if step == steps:
                break
        epoch += 1
    return losses


def main():
    args = parse_args()
    started = time.perf_counter()
    world_of_one_unless_launched("make lesson5-split NPROC=2  (or: torchrun --nproc-per-node=2 "
                                 "scripts/lesson5_model_split.py)")
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    local_world_size = int(os.environ["LOCAL_WORLD_SIZE"])
    nodes = world_size // local_world_size
    k = args.devices_per_process

    # This process's devices: k of them, starting at k x LOCAL_RANK (not at LOCAL_RANK).
    first, backend = pick_device(k * local_rank)
    timeout = timedelta(seconds=args.timeout)
    if first.type == "cuda":
        if k * local_world_size > torch.cuda.device_count():
            fail(f"{local_world_size} process(es) per node x {k} GPUs each need "
                 f"{k * local_world_size} GPUs, and this node shows "
                 f"{torch.cuda.device_count()}; start fewer processes or lower "
                 "--devices-per-process")
        devices = [torch.device("cuda", first.index + i) for i in range(k)]
        torch.cuda.set_device(devices[0])
    else:
        devices = [first] * k  # no GPUs: every stage on the CPU, the same code
    dist.init_process_group(backend, timeout=timeout)

    try:
        batch, per_process, rounded = split_batch(args.batch_size, BASE_BATCH, world_size)
    except ValueError as mistake:
        fail(str(mistake))
    train_set, _ = load_datasets("digits")
    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, seed=args.seed)
    loader = DataLoader(train_set, batch_size=per_process, sampler=sampler)
    lr = BASE_LR * batch / BASE_BATCH

    if rank == 0:
        if first.type == "cpu":
            print(f"no GPUs here: all {k} stages of every process run on the CPU (the same "
                  "code; on GPUs they would be k different devices)")
        print(f"{world_size} process(es) on {nodes} node(s), each driving {k} device(s); "
              f"global batch {batch} = {world_size} x {per_process}, lr {lr:g}{rounded}")

    runs = {}
    for name, stage_devices in (("split", devices), ("unsplit", devices[:1])):
        torch.manual_seed(args.seed)  # the same initial weights for both runs
        model = Split(layers(NUM_CLASSES["digits"]), stage_devices)
        # device_ids=None: the module spans several devices, so DDP must not move its inputs
        # to one of them (and it refuses device_ids for a multi-device module).
        model = DDP(model, device_ids=None)
        optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
        runs[name] = train(model, loader, sampler, optimizer, args.steps, stage_devices,
                           world_size)
        if name == "split":
            placement = [f"stage {i}: {str(d)}" for i, d in enumerate(stage_devices)]
            where = [None] * world_size if rank == 0 else None
            dist.gather_object({"rank": rank, "node": int(os.environ["GROUP_RANK"]),
                                "local rank": local_rank, "pid": os.getpid(),
                                "stages": ", ".join(placement)}, where, dst=0)
            if rank == 0:
                print(format_table(where))

    if rank == 0:
        split, unsplit = runs["split"], runs["unsplit"]
        for step, (a, b) in enumerate(zip(split, unsplit, strict=True), start=1):
            print(f"step {step}/{args.steps}  loss split {a:.6f}  unsplit {b:.6f}  "
                  f"difference {abs(a - b):.2e}")
        worst = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(split, unsplit, strict=True))
        same = worst <= args.tolerance
        print(f"check: the split model {'matches' if same else 'DOES NOT match'} the unsplit "
              f"one over {args.steps} steps (largest relative loss difference {worst:.1e}, "
              f"tolerance {args.tolerance:g})")
        processes = [replace(p, label=f"{k} stage(s), on the CPU") if first.type == "cpu" else p
                     for p in layout(nodes, k * local_world_size, k)]
        fig = draw(processes, gpus_per_node=k * local_world_size,
                   title=f"the job that ran: {nodes} node(s) x {local_world_size} process(es), "
                         f"each over {k} device(s)"
                         + (" (all on the CPU here)" if first.type == "cpu" else ""))
        os.makedirs(os.path.dirname(args.picture) or ".", exist_ok=True)
        fig.savefig(args.picture, dpi=120)
        print(f"picture of this job: {args.picture}")
        print(summary_line(world_size=world_size, nodes=nodes, devices_per_process=k,
                           loss_split=split[-1], loss_unsplit=unsplit[-1],
                           max_rel_diff=worst, backend=backend,
                           wall_s=round(time.perf_counter() - started, 2)))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
