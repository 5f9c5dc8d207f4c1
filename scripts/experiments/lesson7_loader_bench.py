"""Lesson 7 experiment: the DataLoader measured: workers, prefetching, persistent workers, seeds.

    make lesson7-loader                                 # runs the step, then this command:
    python scripts/experiments/lesson7_loader_bench.py

Lesson 7's data-loading step gives lesson 3's training loader its workers and options;
this experiment measures when they pay. One process, as one rank of a DDP job
is: each rank has its own DataLoader and its own workers, so what one rank measures here is
what every rank of a job gets (on a machine whose cores the ranks share, divide them). The
dataset does real work per sample: it decodes a PNG (PIL) and augments it (a random crop,
a flip, a brightness change), about as much as an ImageNet-style pipeline does per small
image. Measured:

1. samples/s against num_workers, for the loader alone and with a training step of
   test_resnet consuming the batches (the "4 x GPUs" rule, against this machine's cores);
2. prefetch_factor; 3. persistent_workers (what each epoch pays to start its workers);
4. pin_memory (with a copy to the GPU; on a machine without one it is switched off);
Throughputs are measured --rounds times, the settings of a table taking turns, and shown as
the median with the range of the rounds: a difference inside the range is not one.
5. random seeds: the augmentations drawn on each rank and worker, seeded three ways. The
   ranks are simulated one after another in this process: a loader's seeds come from its
   process's torch generator alone (`_base_seed` in torch/utils/data/dataloader.py), so a
   rank's draws here are those its own process would make.
"""

import io
import json
import os
import shlex
import statistics
import sys
import time
import warnings

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from ddpcourse.cli import ArgumentParser
from ddpcourse.data import digits_table
from ddpcourse.models import create_model
from ddpcourse.report import format_table, summary_line
from ddpcourse.runtime import pick_device


def parse_args():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="0,1,2,4",
                        help="num_workers values to measure, comma-separated")
    parser.add_argument("--batches", type=int, default=10, help="batches per measurement")
    parser.add_argument("--rounds", type=int, default=2,
                        help="each throughput is measured this many times, settings in turn")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads of the training step (a rank's own core)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=64, help="side of the stored PNGs")
    parser.add_argument("--epochs", type=int, default=3, help="epochs for persistent_workers")
    parser.add_argument("--ranks", type=int, default=2, help="ranks simulated for the seeds")
    parser.add_argument("--json", default="", help="write the numbers here (for the figure)")
    parser.add_argument("--skip-training", action="store_true",
                        help="measure the loader alone (no training step)")
    args = parser.parse_args()
    try:
        args.workers = sorted({int(w) for w in args.workers.split(",") if w.strip()})
    except ValueError:
        parser.error(f"--workers {args.workers!r}: use e.g. 0,1,2,4")
    if not args.workers or min(args.workers) < 0 or args.batches < 2 or args.epochs < 2 \
            or args.rounds < 1:
        parser.error("--workers must be >= 0, --batches and --epochs at least 2, --rounds >= 1")
    if not 16 <= args.image_size <= 256 or min(args.batch_size, args.ranks, args.threads) < 1:
        parser.error("--image-size between 16 and 256; --batch-size, --ranks, --threads >= 1")
    return args


class EncodedDigits(Dataset):
    """The digits as PNG files in memory, decoded and augmented one sample at a time.

    Only 256 distinct images are encoded (encoding all would cost seconds at start); the
    dataset cycles through them, each sample decoded again as a file would be."""

    def __init__(self, size: int, length: int = 4096, record_draws: bool = False):
        table = torch.from_numpy(digits_table())
        small = table[:256, :-1].reshape(-1, 1, 8, 8) / 16.0
        big = F.interpolate(small, size=(size, size), mode="bilinear", align_corners=False)
        pixels = (big.clamp(0, 1) * 255).byte().expand(-1, 3, -1, -1).permute(0, 2, 3, 1)
        self.files = []
        for image in pixels.numpy():
            buffer = io.BytesIO()
            Image.fromarray(image).save(buffer, format="PNG")
            self.files.append(buffer.getvalue())
        self.labels = table[:256, -1].long()
        self.length, self.crop, self.record_draws = length, size * 3 // 4, record_draws

    def __len__(self):
        return self.length

    def __getitem__(self, index):
        data = self.files[index % len(self.files)]
        image = np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).copy()  # decode
        x = torch.from_numpy(image).permute(2, 0, 1).float() / 255.0
        # Augment, drawing from torch's generator (in a worker: seeded per worker).
        top, left = torch.randint(0, x.shape[1] - self.crop + 1, (2,)).tolist()
        flip, brightness = torch.rand(1).item() < 0.5, 0.8 + 0.4 * torch.rand(1).item()
        x = x[:, top:top + self.crop, left:left + self.crop]
        x = x.flip(-1) if flip else x
        x = F.interpolate(x[None], size=(32, 32), mode="bilinear", align_corners=False)[0]
        x = (x * brightness - 0.5) / 0.25
        if self.record_draws:
            return torch.tensor([index, top, left, flip, round(brightness, 6)])
        return x, self.labels[index % len(self.labels)]


def measure(loader, batches, step=None, device=None):
    """(samples/s after the first batch, seconds to the first batch)."""
    tick = time.perf_counter()
    seen, first, count = 0, None, 0
    for images, labels in loader:
        if device is not None:
            images = images.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
        if step is not None:
            step(images, labels)
        count += 1
        if first is None:
            first = time.perf_counter()
        else:
            seen += len(labels)
        if count == batches:
            break
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize()
    return seen / max(time.perf_counter() - first, 1e-9), first - tick


def seed_check(dataset, ranks, workers, mode, seed=0):
    """Each rank's augmentation draws under one seeding scheme, then how many repeat."""
    draws = []
    for rank in range(ranks):
        torch.manual_seed(seed)  # every rank seeds its process alike (same initial weights)
        sampler = DistributedSampler(dataset, num_replicas=ranks, rank=rank, shuffle=False)
        options = {}
        if mode == "a generator per rank":
            options["generator"] = torch.Generator().manual_seed(seed + 1000 * rank)
        if mode == "worker_init_fn, one seed":
            options["worker_init_fn"] = reseed_with_constant
        loader = DataLoader(dataset, batch_size=8, sampler=sampler, num_workers=workers,
                            **options)
        draws.append(torch.cat([batch for _, batch in zip(range(8), loader, strict=False)]))
    everything = torch.cat(draws)[:, 1:]  # the draws, without the sample index
    distinct = len({tuple(row.tolist()) for row in everything})
    same_as_rank0 = [float((d[:, 1:] == draws[0][:, 1:]).all(1).float().mean())
                     for d in draws[1:]]
    return {"seeding": mode, "samples": len(everything), "distinct draws": distinct,
            "rank r > 0 draws as rank 0 does": (f"{100 * max(same_as_rank0):.0f}%"
                                                if same_as_rank0 else "-")}


def spread(values) -> str:
    """'median (low-high)' of repeated measurements."""
    return f"{statistics.median(values):.0f} ({min(values):.0f}-{max(values):.0f})"


def reseed_with_constant(worker_id):
    """The mistake: every worker of every rank starts its generator from the same number."""
    torch.manual_seed(1234)


def main():
    args = parse_args()
    started = time.perf_counter()
    device, _ = pick_device(0)
    torch.set_num_threads(args.threads)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    # torch warns when num_workers exceeds the cores it sees (check_worker_number_rationality
    # in dataloader.py); this script goes past them on purpose, and says so once here.
    warnings.filterwarnings("ignore", message="This DataLoader will create")
    gpus = torch.cuda.device_count() if device.type == "cuda" else 0
    dataset = EncodedDigits(args.image_size)
    record = {"cores": cores, "device": device.type, "gpus": gpus, "scaling": []}
    print(f"{cores} CPU cores, {gpus} GPU(s); {len(dataset)} samples of {args.image_size}x"
          f"{args.image_size} PNG, decoded and augmented to 32x32; batch {args.batch_size}; "
          f"the '4 x GPUs' rule says num_workers = {4 * gpus if gpus else '4 x 0 (no GPU)'}; "
          f"torch's DataLoader warns above {cores}")

    def loader(workers, **options):
        return DataLoader(dataset, batch_size=args.batch_size, shuffle=True,
                          num_workers=workers, **options)

    # 1. num_workers, the loader alone and feeding a training step.
    if not args.skip_training:
        torch.manual_seed(0)
        model = create_model("test_resnet", 10).to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def train_step(images, labels):
        loss = F.cross_entropy(model(images.to(device)), labels.to(device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    consumers = [("loader alone", None)] + ([] if args.skip_training else
                                             [("loader + test_resnet step", train_step)])
    rates = {(w, name): [] for w in args.workers for name, _ in consumers}
    for _ in range(args.rounds):
        for workers in args.workers:
            for name, step in consumers:
                rates[workers, name].append(measure(loader(workers), args.batches, step)[0])
    rows = []
    for workers in args.workers:
        row = {"num_workers": workers}
        for name, _ in consumers:
            row[f"{name} samples/s"] = spread(rates[workers, name])
            record["scaling"].append({"setting": name, "num_workers": workers,
                                      "samples_per_s": round(statistics.median(
                                          rates[workers, name])),
                                      "low": round(min(rates[workers, name])),
                                      "high": round(max(rates[workers, name]))})
        rows.append(row)
    print(f"1. num_workers (samples/s: median of {args.rounds} round(s), range):")
    print(format_table(rows))
    best = max(record["scaling"], key=lambda r: r["samples_per_s"]
               if r["setting"] == consumers[-1][0] else -1)
    print(f"fastest with a training step: num_workers={best['num_workers']} on {cores} cores"
          if len(consumers) > 1 else f"fastest: num_workers={best['num_workers']}")

    # 2. prefetch_factor: batches each worker keeps ready ahead of the consumer.
    workers = max(1, min(2, max(args.workers)))
    prefetch = {factor: [] for factor in (1, 2, 4)}
    for _ in range(args.rounds):
        for factor, seen in prefetch.items():
            seen.append(measure(loader(workers, prefetch_factor=factor), args.batches,
                                consumers[-1][1])[0])
    prefetch_rows = [{"num_workers": workers, "prefetch_factor": factor,
                      f"{consumers[-1][0]} samples/s": spread(seen)}
                     for factor, seen in prefetch.items()]
    print("2. prefetch_factor (default 2):")
    print(format_table(prefetch_rows))

    # 3. persistent_workers: without it, every epoch starts (and stops) its workers again.
    firsts, laters = {False: [], True: []}, {False: [], True: []}
    for _ in range(args.rounds):
        for persistent in (False, True):
            shared = loader(workers, persistent_workers=persistent)
            waits = [measure(shared, 3)[1] * 1e3 for _ in range(args.epochs)]
            firsts[persistent].append(waits[0])
            laters[persistent] += waits[1:]
            del shared  # its workers stop here
    persistent_rows = [{"persistent_workers": p,
                        "first batch, epoch 1 (ms)": spread(firsts[p]),
                        "first batch, later epochs (ms)": spread(laters[p])}
                       for p in (False, True)]
    print(f"3. persistent_workers ({workers} workers, {args.epochs} epochs):")
    print(format_table(persistent_rows))

    # 4. pin_memory: page-locked host memory, so the copy to the GPU can run asynchronously.
    if device.type == "cuda":
        pin_rows = []
        for pin in (False, True):
            rate, _ = measure(loader(workers, pin_memory=pin), args.batches, None, device)
            pin_rows.append({"pin_memory": pin, "samples/s (to the GPU)": f"{rate:.0f}"})
        print("4. pin_memory:")
        print(format_table(pin_rows))
    else:
        print("4. pin_memory: no accelerator here; DataLoader would warn and not pin "
              "(torch/utils/data/dataloader.py), so there is nothing to measure")

    # 5. Seeds: the same augmentation on every rank, or on every worker, is a wasted sample.
    draws = EncodedDigits(16, length=args.ranks * 64, record_draws=True)
    seed_rows = [seed_check(draws, args.ranks, 2, mode)
                 for mode in ("torch.manual_seed(0) on every rank", "worker_init_fn, one seed",
                              "a generator per rank")]
    print(f"5. augmentation draws, {args.ranks} rank(s) x 2 workers:")
    print(format_table(seed_rows))

    record.update(prefetch=prefetch_rows, persistent=persistent_rows, seeds=seed_rows,
                  date=time.strftime("%Y-%m-%d"), command="python " + shlex.join(sys.argv))
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
    print(summary_line(cores=cores, gpus=gpus, best_workers=best["num_workers"],
                       best_samples_per_s=best["samples_per_s"],
                       wall_s=round(time.perf_counter() - started, 2)))


if __name__ == "__main__":
    main()
