"""Lesson 7: mixed precision under DDP: bf16 autocast on CPUs and GPUs, fp16 + GradScaler on GPUs.

    make lesson7-amp NPROC=2                            # prints, then runs, this command:
    torchrun --nproc-per-node=2 scripts/lesson7_mixed_precision.py

It keeps lesson3_ddp.py's set-up (process group, device, sampler, model; diff the two) and
its training step, with the forward pass under torch.autocast. The same starting model is
trained once per precision, in the same job, on the same batches:

    fp32    no autocast (lesson 3)
    bf16    torch.autocast(device_type, dtype=torch.bfloat16): CPU and GPU
    fp16    torch.autocast("cuda", dtype=torch.float16) and a GradScaler: GPUs only (fp16's
            small range underflows small gradients to zero; the scaler multiplies the loss
            before backward and divides the gradients after, skipping steps that overflow)

For each: what autocast produced in each kind of layer, the gradients' and weights' dtypes,
ms per step, the activations autograd kept for backward (counted by saved_tensors_hooks,
on any device), the GPU's peak memory where there is one, and the final loss.
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

PRECISIONS = ("fp32", "bf16", "fp16")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def parse_args():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", choices=DATASETS, default="digits")
    parser.add_argument("--model", default="resnet10t", help="a timm model name")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=32, help="samples per process")
    parser.add_argument("--steps", type=int, default=8, help="timed steps per precision")
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
    if args.steps < 2 or args.batch_size < 1:
        parser.error("--steps must be at least 2 and --batch-size at least 1")
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


def main():
    args = parse_args()
    started = time.perf_counter()

    world_of_one_unless_launched("make lesson7-amp NPROC=2  (or: torchrun --nproc-per-node=2 "
                                 "scripts/lesson7_mixed_precision.py)")
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
    batches = [(x.to(device), y.to(device)) for x, y in train_loader][:args.steps]

    torch.manual_seed(args.seed)  # the same initial weights for every precision
    start = create_model(args.model, NUM_CLASSES[args.dataset]).to(device)
    rows, casts = [], {}
    for precision in precisions:
        dtype = DTYPES.get(precision)  # None: fp32, no autocast
        model = DDP(copy.deepcopy(start),
                    device_ids=[local_rank] if device.type == "cuda" else None)
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
        # fp16's range ends near 6e-5 (subnormals to 6e-8): small gradients would become 0.
        # The scaler multiplies the loss by S (65536 to start), unscales before the step,
        # skips the step when it finds inf/nan and halves S. bf16 has fp32's range.
        scaler = torch.amp.GradScaler("cuda", enabled=precision == "fp16")
        casts[precision] = dtypes_by_layer(model.module, batches[0][0], device, dtype)

        saved_bytes = []

        def count(tensor, saved_bytes=saved_bytes):  # every tensor autograd keeps for backward
            saved_bytes[-1] += tensor.numel() * tensor.element_size()
            return tensor

        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        seconds, loss_sum, skipped = [], 0.0, 0
        model.train()
        for images, labels in batches:
            tick = time.perf_counter()
            saved_bytes.append(0)
            with torch.autograd.graph.saved_tensors_hooks(count, lambda t: t):
                with torch.autocast(device.type, dtype=dtype or torch.float32,
                                    enabled=dtype is not None):
                    logits = model(images)                   # convs, matmuls: low precision
                    loss = F.cross_entropy(logits, labels)   # autocast keeps this in fp32
            optimizer.zero_grad(set_to_none=True)
            scale = scaler.get_scale()
            scaler.scale(loss).backward()  # outside autocast; gradients come out fp32
            scaler.step(optimizer)         # unscales first; skips the step on inf/nan
            scaler.update()
            skipped += scaler.get_scale() < scale  # a smaller scale: that step was skipped
            if device.type == "cuda":
                torch.cuda.synchronize()
            seconds.append(time.perf_counter() - tick)
            loss_sum = loss.item()
        grad_dtype = str(next(model.parameters()).grad.dtype).split(".")[1]
        weight_dtype = str(next(model.parameters()).dtype).split(".")[1]
        stats = torch.tensor([sorted(seconds[1:])[len(seconds[1:]) // 2], loss_sum,
                              max(saved_bytes), torch.cuda.max_memory_allocated(device)
                              if device.type == "cuda" else 0], dtype=torch.float64,
                             device=device)
        dist.all_reduce(stats, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
        rows.append({"precision": precision, "weights": weight_dtype, "grads": grad_dtype,
                     "ms/step": f"{stats[0].item() * 1e3:.1f}",
                     "saved for backward MB": f"{stats[2].item() / 2**20:.1f}",
                     "GPU peak MB": f"{stats[3].item() / 2**20:.0f}"
                     if device.type == "cuda" else "-",
                     "last loss": f"{stats[1].item():.4f}",
                     "skipped steps": skipped if precision == "fp16" else "-"})

    if rank == 0:
        print(f"{args.model} at {args.image_size}x{args.image_size}, {world_size} process(es) "
              f"x {args.batch_size} samples, {args.steps} steps per precision, "
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
