r"""Lesson 7 experiment: an in-memory dataset loaded by every process, or once and shared.

    make lesson7-shared NPROC=3                         # prints, then runs, these commands:
    torchrun --nproc-per-node=3 scripts/experiments/lesson7_shared_dataset.py --mode copy \
        --json runs/lesson7_shared.json
    torchrun --nproc-per-node=3 scripts/experiments/lesson7_shared_dataset.py --mode shared \
        --json runs/lesson7_shared.json

copy    every process builds the whole dataset in its own memory (what a Dataset that loads
        everything in __init__ does under torchrun): W processes, W copies.
shared  local rank 0 builds it once and writes it to a file in /dev/shm (memory, not disk);
        after a barrier every process maps that file with torch.from_file(shared=True). The
        pages belong to the file, so the kernel keeps one copy for all the processes.

Then every process reads all of its samples through a DataLoader (touching every page) and
reports its memory from /proc (psutil's memory_full_info): USS, the memory only it uses,
which is what it would free by exiting; PSS, its fair share of pages it shares; and the
shared part of its resident set.
"""

import json
import os
import shlex
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from ddpcourse.cli import ArgumentParser
from ddpcourse.data import digits_table
from ddpcourse.report import format_table, summary_line
from ddpcourse.runtime import fail, world_of_one_unless_launched

MB = 2**20


def parse_args():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["copy", "shared"], default="shared")
    parser.add_argument("--dataset-mb", type=int, default=96,
                        help="size of the in-memory dataset (float32 images)")
    parser.add_argument("--folder", default="/dev/shm" if os.path.isdir("/dev/shm") else "runs",
                        help="where the shared file lives (/dev/shm is memory)")
    parser.add_argument("--json", default="", help="add this run's numbers to this file")
    parser.add_argument("--timeout", type=float, default=120,
                        help="seconds a collective may wait for the other processes")
    args = parser.parse_args()
    if not 1 <= args.dataset_mb <= 8192:
        parser.error("--dataset-mb must be between 1 and 8192")
    return args


def image_count(megabytes: int) -> int:
    return megabytes * MB // (3 * 32 * 32 * 4)


def image_chunks(megabytes: int):
    """The "load": digits decoded into float32 images [n, 3, 32, 32], repeated, each copy a
    little different, as a real dataset's images would be, until `megabytes` MB are made.
    Yielded a chunk at a time, always in the same buffer: the chunks must be copied (or
    written) before the next one comes, and the process holds one chunk, never a second
    copy of the dataset (freed memory would mostly stay with the process: glibc keeps it)."""
    table = torch.from_numpy(digits_table())
    digits = F.interpolate(table[:, :-1].reshape(-1, 1, 8, 8) / 16.0, size=(32, 32),
                           mode="bilinear", align_corners=False).expand(-1, 3, -1, -1)
    buffer = torch.empty(digits.shape)
    left, k = image_count(megabytes), 0
    while left > 0:
        n = min(left, len(digits))
        yield torch.add(digits[:n], 0.01 * k, out=buffer[:n])
        left, k = left - n, k + 1


def memory_of_this_process() -> dict:
    """{rss, uss, pss, shared} in MB, from /proc (psutil when installed)."""
    try:
        import psutil

        # /proc/self is this very process, even where os.getpid() answers for a stand-in
        # (the course's test suite starts its processes from a fork server).
        pid = int(os.readlink("/proc/self")) if os.path.islink("/proc/self") else os.getpid()
        info = psutil.Process(pid).memory_full_info()
        return {"rss_mb": info.rss / MB, "uss_mb": info.uss / MB, "pss_mb": info.pss / MB,
                "shared_mb": (info.rss - info.uss) / MB}
    except ImportError:  # Linux without psutil: the kernel's own sums for this process
        fields = {}
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                parts = line.split()
                if len(parts) == 3 and parts[2] == "kB":
                    fields[parts[0].rstrip(":")] = int(parts[1]) / 1024
        uss = fields["Private_Clean"] + fields["Private_Dirty"]
        return {"rss_mb": fields["Rss"], "uss_mb": uss, "pss_mb": fields["Pss"],
                "shared_mb": fields["Rss"] - uss}


def main():
    args = parse_args()
    started = time.perf_counter()
    world_of_one_unless_launched()
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    # Only CPU memory is measured here: gloo, whatever the hardware.
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout))
    before = memory_of_this_process()

    tick = time.perf_counter()
    if args.mode == "copy":  # every process, its own copy
        images = torch.empty(image_count(args.dataset_mb), 3, 32, 32)
        offset = 0
        for chunk in image_chunks(args.dataset_mb):
            images[offset:offset + len(chunk)] = chunk
            offset += len(chunk)
    else:
        # One file per node and job: local rank 0 of each node writes it, the others wait.
        path = os.path.join(args.folder, f"lesson7_dataset_{os.environ['MASTER_PORT']}_"
                                         f"{os.environ.get('GROUP_RANK', '0')}.f32")
        shape = (3, 32, 32)
        if local_rank == 0:
            try:
                with open(path + ".tmp", "wb") as f:
                    for chunk in image_chunks(args.dataset_mb):
                        chunk.numpy().tofile(f)
                os.replace(path + ".tmp", path)  # whole, or not there at all
            except OSError as error:
                fail(f"cannot write {path}: {error.strerror}; pass --folder")
        dist.barrier()  # the file is complete before anyone maps it
        count = os.path.getsize(path) // (3 * 32 * 32 * 4)
        # shared=True maps the file MAP_SHARED: every process sees the same pages.
        images = torch.from_file(path, shared=True, size=count * 3 * 32 * 32,
                                 dtype=torch.float32).view(count, *shape)
    labels = torch.arange(len(images)) % 10
    load_s = time.perf_counter() - tick

    # Read every sample once, as an epoch would: every page of the dataset gets touched.
    dataset = TensorDataset(images, labels)
    loader = DataLoader(dataset, batch_size=256, sampler=DistributedSampler(
        dataset, num_replicas=1, rank=0, shuffle=False))  # all of it, to touch every page
    checksum = sum(float(x.sum()) for x, _ in loader)
    # A page counts as unique while one process alone has touched it: measure once all have.
    dist.barrier()
    after = memory_of_this_process()
    mine = {"rank": rank, "pid": os.getpid(), "load_s": round(load_s, 3),
            "checksum": round(checksum, 1), **{k: round(v, 1) for k, v in after.items()},
            "uss_growth_mb": round(after["uss_mb"] - before["uss_mb"], 1),
            "shared_growth_mb": round(after["shared_mb"] - before["shared_mb"], 1)}
    everyone = [None] * world_size if rank == 0 else None
    dist.gather_object(mine, everyone, dst=0)
    dist.barrier()  # everyone has measured before the file goes
    if args.mode == "shared" and local_rank == 0:
        os.remove(path)  # mapped pages stay valid until each process exits

    if rank == 0:
        dataset_mb = images.numel() * 4 / MB
        print(f"{args.mode}: a {dataset_mb:.0f} MB dataset ({len(images)} images 3x32x32 "
              f"float32) on {world_size} process(es)")
        print(format_table([{"rank": p["rank"], "load s": p["load_s"], "RSS MB": p["rss_mb"],
                             "unique (USS) MB": p["uss_mb"], "PSS MB": p["pss_mb"],
                             "shared MB": p["shared_mb"],
                             "added: unique MB": p["uss_growth_mb"],
                             "added: shared MB": p["shared_growth_mb"]} for p in everyone]))
        same = len({p["checksum"] for p in everyone}) == 1
        total_uss = sum(p["uss_mb"] for p in everyone)
        growth = [p["uss_growth_mb"] for p in everyone]
        print(f"check: every process read the same data: {same}; unique memory grew by "
              f"{max(growth):.0f} MB at most per process, against a {dataset_mb:.0f} MB dataset")
        if args.json:
            record = {"runs": []}
            if os.path.exists(args.json):
                with open(args.json) as f:
                    record = json.load(f)
            record["runs"] = [r for r in record["runs"] if r["mode"] != args.mode]
            record["runs"].append({"mode": args.mode, "dataset_mb": round(dataset_mb, 1),
                                   "date": time.strftime("%Y-%m-%d"),
                                   "command": f"torchrun --nproc-per-node={world_size} "
                                              + shlex.join(sys.argv),
                                   "total_uss_mb": round(total_uss, 1),
                                   "processes": everyone})
            record["runs"].sort(key=lambda r: r["mode"])
            os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
            with open(args.json, "w") as f:
                json.dump(record, f, indent=1)
        print(summary_line(mode=args.mode, world_size=world_size, dataset_mb=round(dataset_mb),
                           max_uss_growth_mb=max(growth), total_uss_mb=round(total_uss),
                           same_data=same, wall_s=round(time.perf_counter() - started, 2)))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
