"""Lesson 7 experiment: mixed precision measured: what autocast casts, time, memory, loss.

    make lesson7-amp NPROC=2                            # runs the step, then this command:
    torchrun --nproc-per-node=2 scripts/experiments/lesson7_amp_bench.py

The step scripts/lesson7_mixed_precision.py trains under autocast; this experiment trains
the same starting model once per precision, in the same job, on the same batches, with the
step's DTYPES:

    fp32    no autocast (lesson 3)
    bf16    torch.autocast(device_type, dtype=torch.bfloat16): CPU and GPU
    fp16    torch.autocast("cuda", dtype=torch.float16) and a GradScaler: GPUs only (fp16's
            small range underflows small gradients to zero; the scaler multiplies the loss
            before backward and divides the gradients after, skipping steps that overflow)

For each: what autocast produced in each kind of layer, the gradients' and weights' dtypes,
ms per step, the activations autograd kept for backward, the GPU's peak memory where there
is one, and the final loss. The activations are counted by saved_tensors_hooks in one extra
forward of its own: a Python call per saved tensor would slow the timed steps, and unevenly
(more tensors, more calls), so the timed steps run without hooks.
"""

import copy
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler

from ddpcourse.cli import ArgumentParser
from ddpcourse.data import DATASETS, NUM_CLASSES, load_datasets
from ddpcourse.models import create_model
from ddpcourse.report import format_table, summary_line
from ddpcourse.runtime import pick_device, world_of_one_unless_launched
from ddpcourse.scripts import import_script

DTYPES = import_script("lesson7_mixed_precision", "DTYPES")  # the step's own

PRECISIONS = tuple(DTYPES)


def parse_args():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", choices=DATASETS, default="digits")
    parser.add_argument("--model", default="resnet10t", help="a timm model name")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=32, help="samples per process")
    parser.add_argument("--steps", type=int, default=4, help="timed steps per precision per round")
    parser.add_argument("--rounds", type=int, default=2,
                        help="the precisions take turns this many times")
    parser.add_argument("--precisions", default=",".join(PRECISIONS),
                        help="some of fp32,bf16,fp16 (fp16 runs where CUDA is)")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=120,
                        help="seconds a collective may wait for the other processes")
    args = parser.parse_args()
    args.precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    if not args.precisions or any(p not in PRECISIONS for p in args.precisions):
        parser.error("--precisions takes some of fp32,bf16,fp16")
    if args.steps < 1 or args.rounds < 1 or args.steps * args.rounds < 2 or args.batch_size < 1:
        parser.error("--steps, --rounds and --batch-size must be at least 1, with 2 steps "
                     "in all")
    return args


def cpu_bf16_flags() -> str:
    """The CPU's bf16 instruction sets, from /proc/cpuinfo (Linux; elsewhere '')."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        return ""
    return ", ".join(f for f in ("avx512_bf16", "amx_bf16", "avxneconvert") if f in flags)


def dtypes_by_layer(model, images, device, dtype):
    """{kind of layer: dtype of its output} for one forward under autocast."""
    seen = {}

    def note(module, _inputs, output):
        seen.setdefault(type(module).__name__, str(output.dtype).split(".")[1])

    hooks = [m.register_forward_hook(note) for m in model.modules() if not list(m.children())]
    with torch.no_grad(), torch.autocast(device.type, dtype=dtype or torch.float32,
                                         enabled=dtype is not None):
        logits = model(images)
        loss = F.cross_entropy(logits, torch.zeros(len(images), dtype=torch.long,
                                                   device=device))
    for hook in hooks:
        hook.remove()
    seen["cross_entropy (loss)"] = str(loss.dtype).split(".")[1]
    return seen


def saved_for_backward(model, batch, device, dtype):
    """Bytes of the tensors autograd keeps for backward in one forward (with its loss)."""
    saved = [0]

    def count(tensor):
        saved[0] += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(count, lambda t: t), \
            torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
        F.cross_entropy(model(batch[0]), batch[1])  # never backward: the graph is dropped
    return saved[0]


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
    dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout))

    precisions = [p for p in args.precisions if p != "fp16" or device.type == "cuda"]
    if rank == 0 and len(precisions) < len(args.precisions):
        print("note: fp16 with GradScaler runs on CUDA GPUs only; left out on the "
              f"{device.type}")

    train_set, _ = load_datasets(args.dataset, image_size=args.image_size)
    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, shuffle=True,
                                 seed=args.seed)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler,
                              drop_last=True)
    batches = [(x.to(device), y.to(device)) for x, y in train_loader][:args.steps * args.rounds]

    torch.manual_seed(args.seed)  # the same initial weights for every precision
    start = create_model(args.model, NUM_CLASSES[args.dataset]).to(device)
    rows, casts, runs = [], {}, {}
    for precision in precisions:
        dtype = DTYPES[precision] if precision != "fp32" else None  # None: no autocast
        model = DDP(copy.deepcopy(start),
                    device_ids=[local_rank] if device.type == "cuda" else None)
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
        scaler = torch.amp.GradScaler("cuda", enabled=precision == "fp16")  # as in the step
        casts[precision] = dtypes_by_layer(model.module, batches[0][0], device, dtype)
        runs[precision] = {"dtype": dtype, "model": model, "optimizer": optimizer,
                           "scaler": scaler, "seconds": [], "skipped": 0, "next": 0,
                           "saved": saved_for_backward(model.module, batches[0], device, dtype)}

    # The precisions take turns, --steps steps each, --rounds times: a busy machine slows
    # them alike. Each run goes on through the batches where its last turn stopped.
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for _ in range(args.rounds):
        for run in runs.values():
            model, scaler, dtype = run["model"], run["scaler"], run["dtype"]
            model.train()
            dist.barrier()
            for _ in range(args.steps):
                images, labels = batches[run["next"] % len(batches)]
                run["next"] += 1
                tick = time.perf_counter()
                with torch.autocast(device.type, dtype=dtype or torch.float32,
                                    enabled=dtype is not None):
                    loss = F.cross_entropy(model(images), labels)
                run["optimizer"].zero_grad(set_to_none=True)
                scale = scaler.get_scale()
                scaler.scale(loss).backward()
                scaler.step(run["optimizer"])
                scaler.update()
                run["skipped"] += scaler.get_scale() < scale  # a smaller scale: skipped
                if device.type == "cuda":
                    torch.cuda.synchronize()
                run["seconds"].append(time.perf_counter() - tick)
                run["loss"] = loss.item()
    for precision, run in runs.items():
        parameter = next(run["model"].parameters())
        seconds = run["seconds"][1:]  # the first step warms up
        turns = [run["seconds"][t * args.steps:(t + 1) * args.steps] for t in range(args.rounds)]
        turns = [sorted(t)[len(t) // 2] for t in turns]  # each turn's median: their range
        stats = torch.tensor([sorted(seconds)[len(seconds) // 2], run["loss"], run["saved"],
                              torch.cuda.max_memory_allocated(device)
                              if device.type == "cuda" else 0, min(turns), max(turns)],
                             dtype=torch.float64, device=device)
        dist.all_reduce(stats, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
        rows.append({"precision": precision, "weights": str(parameter.dtype)[6:],
                     "grads": str(parameter.grad.dtype)[6:],
                     "ms/step": f"{stats[0].item() * 1e3:.1f}",
                     "turns' range": f"{stats[4].item() * 1e3:.0f}-{stats[5].item() * 1e3:.0f}",
                     "saved for backward MB": f"{stats[2].item() / 2**20:.1f}",
                     "GPU peak MB": f"{stats[3].item() / 2**20:.0f}"
                     if device.type == "cuda" else "-",
                     f"loss after {len(run['seconds'])} steps": f"{stats[1].item():.4f}",
                     "skipped steps": run["skipped"] if precision == "fp16" else "-"})

    if rank == 0:
        print(f"{args.model} at {args.image_size}x{args.image_size}, {world_size} process(es) "
              f"x {args.batch_size} samples, {args.rounds} turn(s) of {args.steps} steps per "
              "precision, "
              f"{device.type}/{backend}, {torch.get_num_threads()} thread(s) per process")
        if device.type == "cpu":  # bf16 is fast only where the CPU has instructions for it
            print(f"CPU: {torch.backends.cpu.get_cpu_capability()} kernels; bf16 instructions: "
                  f"{cpu_bf16_flags() or 'none listed in /proc/cpuinfo'}")
        else:
            print(f"GPU: {torch.cuda.get_device_name(device)}")
        kinds = sorted({k for c in casts.values() for k in c})
        print("what autocast produced (output dtype of each kind of layer):")
        print(format_table([{"layer": k, **{p: casts[p].get(k, "-") for p in precisions}}
                            for k in kinds]))
        print(format_table(rows))
        print(summary_line(world_size=world_size, device=device.type,
                           **{f"ms_{r['precision']}": r["ms/step"] for r in rows},
                           **{f"saved_mb_{r['precision']}": r["saved for backward MB"]
                              for r in rows},
                           wall_s=round(time.perf_counter() - started, 2)))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
