"""Lesson 7 experiment: DDP's knobs, the errors each one answers, what compressing gradients costs.

    make lesson7-knobs NPROC=2                          # runs the step, then this command:
    torchrun --nproc-per-node=2 scripts/experiments/lesson7_knobs_bench.py

The step scripts/lesson7_ddp_knobs.py sets the knobs; this experiment shows what each is for,
in four parts, each a small table, all in one job (timings alternate over --rounds, so
a busy machine slows every setting alike; each cell is the median of the rounds, with
their range):

1. find_unused_parameters and static_graph: a model with an extra head that some steps do
   not use. Without either knob DDP stops at the next step with an error; the table shows
   which knob fixes which case and what it costs per step.
2. gradient_as_bucket_view: where p.grad lives (its own memory, or a view into DDP's bucket).
3. forward_sync_buffers (broadcast_buffers before torch 2.14, which still takes it with a
   FutureWarning; this experiment passes whichever name the installed torch has): BatchNorm's
   running statistics on every rank, with and without rank 0's buffers broadcast before each
   forward.
4. Communication hooks (the step's COMM_HOOKS): fp16 and bf16 compression of the gradients.
   Each step the exact average is computed too, to measure the error; test_resnet trains on
   the digits with each hook from the same start, once per data order (--orders), so the
   accuracy a hook changes can be read against what a change of data order changes.
"""

import copy
import inspect
import os
import statistics
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, Subset

# torch 2.14 renamed DDP's broadcast_buffers to forward_sync_buffers; older torch has only the
# old name, and 2.14 warns on it: pass whichever this torch takes.
BUFFER_SYNC = next(name for name in ("forward_sync_buffers", "broadcast_buffers")
                   if name in inspect.signature(DDP).parameters)

from ddpcourse.cli import ArgumentParser
from ddpcourse.data import NUM_CLASSES, load_datasets
from ddpcourse.models import create_model
from ddpcourse.report import format_table, summary_line
from ddpcourse.runtime import pick_device, world_of_one_unless_launched
from ddpcourse.scripts import import_script

# the step's own
COMM_HOOKS, evaluate = import_script("lesson7_ddp_knobs", "COMM_HOOKS", "evaluate")


def parse_args():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20,
                        help="timed steps per setting in parts 1-3")
    parser.add_argument("--rounds", type=int, default=3,
                        help="parts 2-3: the settings take turns this many times")
    parser.add_argument("--orders", type=int, default=2,
                        help="part 4: data orders (sampler seeds) each hook trains with")
    parser.add_argument("--hook-epochs", type=int, default=2,
                        help="epochs of test_resnet on the digits per hook in part 4")
    parser.add_argument("--hook-steps", type=int, default=0,
                        help="stop part 4's training after this many steps (0: no limit)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=120,
                        help="seconds a collective may wait for the other processes")
    args = parser.parse_args()
    if args.steps < 2 or args.hook_epochs < 1 or args.hook_steps < 0 or \
            min(args.rounds, args.orders) < 1:
        parser.error("--steps must be at least 2, --hook-epochs, --rounds and --orders at "
                     "least 1, --hook-steps >= 0")
    return args


class TwoHeads(nn.Module):
    """A trunk, the main head, and an auxiliary head used only when asked for."""

    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16),
                                   nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(),
                                   nn.Linear(256, 128), nn.ReLU())
        self.head = nn.Linear(128, 10)
        self.aux = nn.Linear(128, 10)

    def forward(self, x, use_aux=False):
        features = self.trunk(x)
        out = self.head(features)
        return out + self.aux(features) if use_aux else out


def timed_steps(model, batches, aux_on, device):
    """Train over `batches`; aux_on(step) says whether the auxiliary head is used. Returns
    (median ms per step, None) or (None, the first line of DDP's error)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    seconds = []
    try:
        for step, (images, labels) in enumerate(batches):
            tick = time.perf_counter()
            loss = F.cross_entropy(model(images, use_aux=aux_on(step)), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            if device.type == "cuda":
                torch.cuda.synchronize()
            seconds.append(time.perf_counter() - tick)
    except RuntimeError as error:
        return None, f"step {step + 1}: " + str(error).strip().splitlines()[0][:90] + " ..."
    return 1e3 * sorted(seconds)[len(seconds) // 2], None


def measured_hook(compress):
    """A comm hook that sends the bucket compressed (fp16 or bf16, or not at all) and also
    computes the exact fp32 average, to measure the error the compression made."""

    def hook(errors, bucket):
        exact = bucket.buffer().clone()
        dist.all_reduce(exact)
        exact /= dist.get_world_size()
        future = (compress or default_hooks.allreduce_hook)(None, bucket)

        def record(done):
            averaged = done.value()
            averaged = averaged[0] if isinstance(averaged, list) else averaged
            errors.append(((averaged - exact).norm() / exact.norm().clamp_min(1e-30)).item())
            return averaged

        return future.then(record)

    return hook


def main():
    args = parse_args()
    started = time.perf_counter()
    world_of_one_unless_launched()
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    device, backend = pick_device(local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout))
    ids = [local_rank] if device.type == "cuda" else None

    gen = torch.Generator().manual_seed(args.seed + rank)  # each rank its own data
    batches = [(torch.randn(32, 3, 16, 16, generator=gen).to(device),
                torch.randint(0, 10, (32,), generator=gen).to(device))
               for _ in range(args.steps)]
    torch.manual_seed(args.seed)
    start = TwoHeads().to(device)

    def timing(samples):
        """'median (min-max)' of the rounds' ms/step, or '-' when the setting failed."""
        if not samples:
            return "-"
        return f"{statistics.median(samples):.2f} ({min(samples):.2f}-{max(samples):.2f})"

    # 1. Unused parameters. DDP expects a gradient for every parameter in every backward;
    # a parameter that got none leaves its bucket unfinished, and the next step stops.
    cases = [("aux never used", lambda step: False),
             ("aux used on odd steps", lambda step: step % 2 == 1),
             ("aux always used", lambda step: True)]
    knobs = [("defaults", {}), ("find_unused_parameters=True", {"find_unused_parameters": True}),
             ("static_graph=True", {"static_graph": True})]
    settings = [(c, k) for c in cases for k in knobs if c[0] != "aux always used" or k[1] == {}]
    unused = {(case, knob): ([], None) for (case, _), (knob, _) in settings}
    for _ in range(args.rounds):
        for (case, aux_on), (knob, options) in settings:
            model = DDP(copy.deepcopy(start), device_ids=ids, **options)
            ms, error = timed_steps(model, batches, aux_on, device)
            if ms is None:
                unused[case, knob] = (unused[case, knob][0], error)
            else:
                unused[case, knob][0].append(ms)
            dist.barrier()
    unused_rows = [{"case": case, "knob": knob, "ms/step": timing(ms),
                    "result": f"error at {error}" if error else "trains"}
                   for (case, knob), (ms, error) in unused.items()]

    # 2. gradient_as_bucket_view: does p.grad share memory with DDP's bucket?
    view_ms, view_rows = {False: [], True: []}, {}
    for _ in range(args.rounds):
        for as_view in (False, True):
            model = DDP(copy.deepcopy(start), device_ids=ids, gradient_as_bucket_view=as_view)
            view_ms[as_view].append(timed_steps(model, batches, lambda step: True, device)[0])
            storages = {p.grad.untyped_storage().data_ptr() for p in model.parameters()}
            view_rows[as_view] = {
                "gradient_as_bucket_view": as_view,
                "gradient tensors": len(list(model.parameters())),
                "their storages": len(storages),
                "gradient bytes": sum(p.grad.numel() * p.grad.element_size()
                                      for p in model.parameters()),
                "extra copy in buckets": "no" if as_view else "yes (same size)"}
    view_rows = [{**row, "ms/step": timing(view_ms[v])} for v, row in view_rows.items()]

    # 3. forward_sync_buffers: BatchNorm's running mean after training, across the ranks.
    buffer_ms, spreads = {True: [], False: []}, {}
    for _ in range(args.rounds):
        for broadcast in (True, False):
            model = DDP(copy.deepcopy(start), device_ids=ids, **{BUFFER_SYNC: broadcast})
            buffer_ms[broadcast].append(timed_steps(model, batches, lambda step: True,
                                                    device)[0])
            running = model.module.trunk[1].running_mean.clone()
            copies = [torch.empty_like(running) for _ in range(world_size)]
            dist.all_gather(copies, running)
            spreads[broadcast] = max((c - copies[0]).abs().max().item() for c in copies)
    buffer_rows = [{BUFFER_SYNC: b,
                    "max |running_mean(rank r) - rank 0's|": f"{spreads[b]:.2e}",
                    "ms/step": timing(buffer_ms[b])} for b in (True, False)]

    # 4. Communication hooks on a real training run: gradient error and final accuracy,
    # once per data order: how much accuracy moves for reasons unrelated to precision.
    train_set, val_set = load_datasets("digits")
    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, shuffle=True,
                                 seed=args.seed)
    loader = DataLoader(train_set, batch_size=64 // world_size or 1, sampler=sampler,
                        drop_last=True)
    val_loader = DataLoader(Subset(val_set, range(rank, len(val_set), world_size)),
                            batch_size=128)
    torch.manual_seed(args.seed)
    resnet = create_model("test_resnet", NUM_CLASSES["digits"]).to(device)
    hook_rows = []
    for name, compress in COMM_HOOKS.items():
        errors, accuracies = [], []
        for order in range(args.orders):
            sampler.seed = args.seed + order
            model = DDP(copy.deepcopy(resnet), device_ids=ids)
            model.register_comm_hook(errors, measured_hook(compress))
            optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
            steps = 0
            for epoch in range(args.hook_epochs):
                sampler.set_epoch(epoch)
                model.train()
                for images, labels in loader:
                    if steps == args.hook_steps > 0:
                        break
                    steps += 1
                    loss = F.cross_entropy(model(images.to(device)), labels.to(device))
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    optimizer.step()
            counts = evaluate(model.module, val_loader, device)  # the step's evaluation
            dist.all_reduce(counts)
            accuracies.append(counts[0].item() / counts[1].item())
        hook_rows.append({"comm hook": name, "bytes sent per value": 2 if compress else 4,
                          "gradient error (median, max)":
                          f"{statistics.median(errors):.1e}, {max(errors):.1e}",
                          "val acc per data order": ", ".join(f"{a:.3f}" for a in accuracies),
                          "mean": f"{statistics.mean(accuracies):.3f}"})

    if rank == 0:
        print(f"{world_size} process(es), {device.type}/{backend}")
        print(f"1. parameters without a gradient (an auxiliary head); ms/step: median of "
              f"{args.rounds} round(s) (range):")
        print(format_table(unused_rows))
        print("2. where the gradients live:")
        print(format_table(view_rows))
        print("3. BatchNorm buffers after training (each rank saw its own batches):")
        print(format_table(buffer_rows))
        print(f"4. compressed gradients: test_resnet, {steps} steps of digits, global batch "
              f"{64 // world_size * world_size}, from the same start, {args.orders} data "
              "order(s) each (gradient error = |compressed - exact| / |exact| per bucket):")
        print(format_table(hook_rows))
        by_hook = {row["comm hook"]: row for row in hook_rows}
        print(summary_line(world_size=world_size,
                           val_acc_fp32=by_hook["none"]["mean"],
                           val_acc_fp16=by_hook["fp16"]["mean"],
                           val_acc_bf16=by_hook["bf16"]["mean"],
                           wall_s=round(time.perf_counter() - started, 2)))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
