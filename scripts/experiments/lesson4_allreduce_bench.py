"""Lesson 4: what an all-reduce costs. Time, algbw and busbw from 1 KB to 256 MB.

    make bench-allreduce                     # world sizes 2 and 4, then a plot in runs/
    .venv/bin/python scripts/experiments/lesson4_allreduce_bench.py --max-bytes 1M --world-sizes 2
    torchrun --nproc-per-node=4 scripts/experiments/lesson4_allreduce_bench.py   # one world size

Started without torchrun, it launches itself once per world size, then fits the cost model
and draws runs/lesson4_allreduce_bench.png. Three ways to sum a float32 tensor over all ranks:

    all_reduce   dist.all_reduce, the backend's own algorithm
    ring         ring_all_reduce from lesson 4's exercises (the reference solution when it is
                 there, else yours once it is written), built from send/recv
    naive        every rank sends to rank 0, which adds and sends the sum back

Bandwidth as nccl-tests defines it: algbw = bytes / time, and for all-reduce
busbw = algbw * 2(W-1)/W, the rate each rank's link carried in a ring; it does not grow with
W, so it compares across world sizes and with the hardware's limit. The limit printed beside
it is this machine's memory-copy bandwidth (a torch copy_ of 256 MB).
"""

import json
import math
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

from ddpcourse.cli import ArgumentParser, byte_count, human

ROOT = Path(__file__).resolve().parents[2]
METHODS = ("all_reduce", "ring", "naive")
parser = ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--min-bytes", type=byte_count, default=byte_count("1K"))
parser.add_argument("--max-bytes", type=byte_count, default=byte_count("256M"),
                    help="largest message (default 256M; 1M makes a quick run)")
parser.add_argument("--world-sizes", default="",
                    help="comma-separated, when started without torchrun (default: 2,4 on CPU; "
                         "2,4,8 up to the number of GPUs)")
parser.add_argument("--methods", default=",".join(METHODS), help=f"some of {','.join(METHODS)}")
parser.add_argument("--ring", choices=["auto", "solutions", "student"], default="auto",
                    help="whose ring_all_reduce to time (auto: the solution if present)")
parser.add_argument("--json", default="", help="where rank 0 writes its numbers")
parser.add_argument("--plot", default="runs/lesson4_allreduce_bench.png")
parser.add_argument("--timeout", type=float, default=300,
                    help="process-group timeout in seconds")
args = parser.parse_args()
if args.min_bytes < 4 or args.min_bytes % 4:
    parser.error("--min-bytes must be a multiple of 4 bytes (float32 elements)")
if args.max_bytes < args.min_bytes:
    parser.error(f"--max-bytes ({args.max_bytes}) is smaller than --min-bytes ({args.min_bytes})")
if args.max_bytes > byte_count("1G"):
    parser.error("--max-bytes above 1G would need several GB of memory per rank")
methods = [m.strip() for m in args.methods.split(",") if m.strip()]
if not methods or any(m not in METHODS for m in methods):
    parser.error(f"--methods takes some of {','.join(METHODS)}")
if args.timeout <= 0:
    parser.error("--timeout must be a positive number of seconds")
try:
    WORLDS = [int(w) for w in args.world_sizes.split(",")] if args.world_sizes.strip() else []
except ValueError:
    parser.error(f"--world-sizes {args.world_sizes!r}: use e.g. 2,4")
if any(w < 2 for w in WORLDS):
    parser.error("--world-sizes: an all-reduce needs at least 2 processes")
SIZES = []
size = args.min_bytes
while size <= args.max_bytes:
    SIZES.append(size)
    size *= 4

import torch


def iterations(nbytes: int) -> int:
    """Enough repeats to time small messages, few for big ones (the run stays short)."""
    return max(3, min(50, (64 << 20) // nbytes))


def memcpy_bandwidth(device) -> tuple[float, int]:
    """(GB/s, threads) of copy_ between two 256 MB tensors: bytes copied per second."""
    src = torch.ones(64 << 20, device=device)
    dst = torch.empty_like(src)
    best = math.inf
    for _ in range(5):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        dst.copy_(src)
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return src.numel() * 4 / best / 1e9, torch.get_num_threads()


# --- under torchrun: measure one world size ------------------------------------------------

def worker():
    import torch.distributed as dist

    from ddpcourse.exercises import exercises_for_a_script
    from ddpcourse.report import format_table, summary_line
    from ddpcourse.runtime import pick_device

    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    device, backend = pick_device(local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    # device_id binds the group to this GPU, so nccl's barrier knows which one to use.
    dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout),
                            device_id=device if device.type == "cuda" else None)
    world = dist.get_world_size()
    if world < 2:
        raise SystemExit("error: an all-reduce benchmark needs at least 2 processes")

    def naive_all_reduce(tensor):
        """Gather to rank 0, add, send back: rank 0's link carries 2(W-1) whole tensors."""
        if rank == 0:
            incoming = torch.empty_like(tensor)
            for src in range(1, world):
                dist.recv(incoming, src=src)
                tensor += incoming
            for dst in range(1, world):
                dist.send(tensor, dst=dst)
        else:
            dist.send(tensor, dst=0)
            dist.recv(tensor, src=0)

    run = {"all_reduce": dist.all_reduce, "naive": naive_all_reduce}
    ring_from = None
    if "ring" in methods:
        exercises, which = exercises_for_a_script(4, args.ring)
        ring = exercises.ring_all_reduce
        try:
            ring(torch.zeros(4, device=device))  # every rank fails alike if it is a stub
            run["ring"], ring_from = ring, which
        except NotImplementedError:
            if rank == 0:
                print("note: ring_all_reduce is not written yet (exercise l4_ring_allreduce); "
                      "timing the others")
    chosen = [m for m in methods if m in run]

    # The three must agree before their speed means anything.
    reference = torch.randn(1001, generator=torch.Generator().manual_seed(rank)).to(device)
    want = reference.clone()
    dist.all_reduce(want)
    for name in chosen:
        got = reference.clone()
        run[name](got)
        if not torch.allclose(got, want, rtol=1e-4, atol=1e-4):
            raise SystemExit(f"error: {name} gave a different sum than dist.all_reduce")

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    def seconds_per_call(fn, tensor, iters):
        """The mean time of a call, over `iters` calls in 3 rounds; the best round counts
        (other programs on the machine slow some rounds down, never speed one up)."""
        fn(tensor)  # warm-up: connections, buffers, caches
        per_round, best = max(1, iters // 3), math.inf
        for _ in range(3):
            sync()
            dist.barrier()
            start = time.perf_counter()
            for _ in range(per_round):
                fn(tensor)
            sync()
            elapsed = torch.tensor([time.perf_counter() - start], device=device)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # as slow as the slowest rank
            best = min(best, elapsed.item() / per_round)
        return best

    copy_gbps = threads = None
    if rank == 0:
        copy_gbps, threads = memcpy_bandwidth(device)
        print(f"W={world}, {backend} on {device.type}; methods: {', '.join(chosen)}"
              + (f" (ring from {ring_from})" if ring_from else "")
              + f"; memory copy on rank 0: {copy_gbps:.2f} GB/s with {threads} thread(s)",
              flush=True)
    dist.barrier()

    rows = []
    bus_factor = 2 * (world - 1) / world
    for nbytes in SIZES:
        x = torch.zeros(nbytes // 4, device=device)  # zeros: sums stay finite however often
        iters = iterations(nbytes)
        progress = []
        for name in chosen:
            t = seconds_per_call(run[name], x, iters)
            algbw = nbytes / t / 1e9
            rows.append({"method": name, "bytes": nbytes, "world_size": world, "iters": iters,
                         "time_s": t, "algbw_GBps": algbw, "busbw_GBps": algbw * bus_factor})
            progress.append(f"{name} {t * 1e6:,.0f} us")
        del x
        if rank == 0:
            print(f"  {human(nbytes):>7}: " + ", ".join(progress), flush=True)

    if rank == 0:
        for name in chosen:
            print(f"\n{name}, W={world}: busbw = algbw * 2(W-1)/W = algbw * {bus_factor:.2f}")
            print(format_table([
                {"size": human(r["bytes"]), "iters": r["iters"],
                 "time us": f"{r['time_s'] * 1e6:,.1f}", "algbw GB/s": f"{r['algbw_GBps']:.3f}",
                 "busbw GB/s": f"{r['busbw_GBps']:.3f}"}
                for r in rows if r["method"] == name]))
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps({
                "world_size": world, "backend": backend, "device": device.type,
                "memcpy_GBps": copy_gbps, "memcpy_threads": threads, "ring_from": ring_from,
                "rows": rows}, indent=1))
        peak = max(rows, key=lambda r: r["busbw_GBps"])
        print(summary_line(world_size=world, backend=backend, sizes=len(SIZES),
                           peak_busbw_GBps=round(peak["busbw_GBps"], 3),
                           peak_method=peak["method"], memcpy_GBps=round(copy_gbps, 2)))
    dist.destroy_process_group()


# --- without torchrun: one job per world size, then the cost model and the plot ------------

def fit_alpha_beta(rows: list[dict], world: int, method: str) -> tuple[float, float] | None:
    """Least-squares alpha (s per message) and beta (s per byte) of the cost model.

    ring / all_reduce:  t = 2(W-1) alpha + 2(W-1)/W n beta   (each rank, each of 2(W-1) steps)
    naive:              t = 2(W-1) alpha + 2(W-1) n beta     (rank 0's link, one message at a time)
    Fitted on relative error, so small and large messages count alike.
    """
    import numpy as np

    mine = [r for r in rows if r["method"] == method and r["world_size"] == world]
    if len(mine) < 2:
        return None
    per_byte = 2 * (world - 1) / (world if method != "naive" else 1)
    a = np.array([[2 * (world - 1) / r["time_s"], per_byte * r["bytes"] / r["time_s"]]
                  for r in mine])
    (alpha, beta), *_ = np.linalg.lstsq(a, np.ones(len(mine)), rcond=None)
    return float(alpha), float(beta)


def draw(results: list[dict], path: Path) -> None:
    os.environ.setdefault("MPLBACKEND", "Agg")
    import matplotlib.pyplot as plt

    from ddpcourse.topology import PALETTE

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    colours = {"all_reduce": PALETTE[4], "ring": PALETTE[5], "naive": PALETTE[2]}
    dashes = ["-", "--", ":", "-."]
    for i, result in enumerate(results):
        world = result["world_size"]
        for method in METHODS:
            mine = [r for r in result["rows"] if r["method"] == method]
            if not mine:
                continue
            sizes = [r["bytes"] for r in mine]
            style = {"linestyle": dashes[i % len(dashes)], "marker": "o", "markersize": 3,
                     "color": colours[method], "label": f"{method}, W={world}"}
            left.plot(sizes, [r["busbw_GBps"] for r in mine], **style)
            right.plot(sizes, [r["time_s"] * 1e3 for r in mine], **style)
    copy = max(r["memcpy_GBps"] for r in results)
    left.axhline(copy, color="#333333", linewidth=1)
    left.text(results[0]["rows"][0]["bytes"], copy * 1.12, f"memory copy {copy:.1f} GB/s",
              fontsize=8)
    ticks = [r["bytes"] for r in results[0]["rows"] if r["method"] == results[0]["rows"][0]
             ["method"]]
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(ticks, [human(b).replace(" ", "") for b in ticks], fontsize=8)
        ax.set_xlabel("message size")
        ax.grid(True, which="both", alpha=0.3)
    left.set_ylabel("busbw (GB/s)")
    left.set_title("bus bandwidth: what each rank's link carried per second", fontsize=10)
    right.set_ylabel("time per all-reduce (ms)")
    right.set_title("time: flat for small messages (latency), then linear (bandwidth)",
                    fontsize=10)
    right.legend(fontsize=8)
    backend = results[0]["backend"]
    fig.suptitle(f"all-reduce of float32 tensors, {backend} on {results[0]['device']}",
                 fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def driver():
    from ddpcourse.cluster.launch import LaunchError, launch, visible_gpu_count
    from ddpcourse.report import format_table, summary_line

    started = time.perf_counter()
    gpus = visible_gpu_count()
    if WORLDS:
        worlds = WORLDS
    else:
        worlds = [w for w in (2, 4, 8) if w <= gpus] if gpus else [2, 4]
        if not worlds:  # one GPU: nobody to all-reduce with
            print("note: one GPU has no partner for an all-reduce; measuring on the CPU with "
                  "gloo instead", flush=True)
            os.environ["CUDA_VISIBLE_DEVICES"] = ""  # for the launcher and the processes
            worlds = [2, 4]
    print(f"sizes {human(SIZES[0])} .. {human(SIZES[-1])} ({len(SIZES)}), world sizes "
          f"{worlds}, methods {','.join(methods)}", flush=True)
    results = []
    for world in worlds:
        out = ROOT / "runs" / f"lesson4_allreduce_W{world}.json"
        out.unlink(missing_ok=True)
        script_args = [f"--min-bytes={args.min_bytes}", f"--max-bytes={args.max_bytes}",
                       f"--methods={','.join(methods)}", f"--ring={args.ring}",
                       f"--json={out}", f"--timeout={args.timeout:g}"]
        try:
            result = launch(__file__, script_args, nproc=world, timeout=1800)
        except LaunchError as error:
            sys.exit(f"error: {error}")
        if result.returncode != 0 or not out.exists():
            sys.exit(f"error: the W={world} run failed (exit code {result.returncode})")
        results.append(json.loads(out.read_text()))

    rows = [r for result in results for r in result["rows"]]
    fits = []
    for result in results:
        world = result["world_size"]
        for method in METHODS:
            fit = fit_alpha_beta(rows, world, method)
            mine = [r for r in rows if r["method"] == method and r["world_size"] == world]
            if not mine:
                continue
            peak = max(mine, key=lambda r: r["busbw_GBps"])
            fits.append({"method": method, "W": world,
                         "peak busbw GB/s": f"{peak['busbw_GBps']:.3f}",
                         "at": human(peak["bytes"]),
                         "alpha us": f"{fit[0] * 1e6:.1f}" if fit else "-",
                         "1/beta GB/s": f"{1 / fit[1] / 1e9:.3f}" if fit and fit[1] > 0 else "-"})
    copy = max(r["memcpy_GBps"] for r in results)
    print("\ncost model fitted per method: t = 2(W-1) alpha + (bytes per link) beta")
    print(format_table(fits))
    print(f"limit: memory copy on this machine {copy:.2f} GB/s (torch copy_ of 256 MB, "
          f"{results[0]['memcpy_threads']} thread(s))")
    plot = Path(args.plot)
    draw(results, plot if plot.is_absolute() else ROOT / plot)
    print(f"plot: {args.plot}")
    best = max(rows, key=lambda r: r["busbw_GBps"])
    print(summary_line(world_sizes=",".join(map(str, worlds)), sizes=len(SIZES),
                       peak_busbw_GBps=round(best["busbw_GBps"], 3), peak_method=best["method"],
                       memcpy_GBps=round(copy, 2), wall_s=round(time.perf_counter() - started, 1)))


if __name__ == "__main__":
    worker() if "RANK" in os.environ else driver()
