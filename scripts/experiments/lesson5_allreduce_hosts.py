"""Lesson 5 experiment: all-reduce between hosts that are really separate, against the link.

    make bench-hosts LINK=1gbit                 # prints, then runs, one command per host:
    ip netns exec <host k> torchrun --nnodes=2 --nproc-per-node=1 --rdzv-backend=c10d \
        --rdzv-endpoint=10.213.0.1:29400 --rdzv-id=<run> \
        scripts/experiments/lesson5_allreduce_hosts.py
    python -m ddpcourse.cluster.hosts run --hosts 2 --link "200mbit" \
        scripts/experiments/lesson5_allreduce_hosts.py

Times dist.all_reduce of float32 tensors from 1 KB to --max-bytes, with gloo on the CPU: its
bytes go through TCP sockets on each host's eth0, so a shaped link slows them down. (nccl
between processes of one machine would use shared memory or NVLink instead, whatever the
network namespaces say.) As in lesson 4: algbw = bytes / time, and
busbw = algbw x 2(W-1)/W, what each rank's link carried per second in a ring. With one
process per host, busbw can never beat the link's rate; the summary compares the two.
"""

import json
import os
import socket
import time
from datetime import timedelta
from pathlib import Path

from ddpcourse.cli import ArgumentParser, byte_count, human
from ddpcourse.cluster.hosts import LINK_ENV, HostsError, parse_link

parser = ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--min-bytes", type=byte_count, default=byte_count("1K"))
parser.add_argument("--max-bytes", type=byte_count, default=byte_count("64M"),
                    help="largest message (default 64M; 1M makes a quick run)")
parser.add_argument("--link", default=os.environ.get(LINK_ENV, ""),
                    help=f"the link's nominal rate, e.g. 1gbit (default: ${LINK_ENV}, which "
                         "ddpcourse.cluster.hosts sets from LINK)")
parser.add_argument("--json", default="", help="where rank 0 writes its numbers")
parser.add_argument("--timeout", type=float, default=300, help="process-group timeout, seconds")
args = parser.parse_args()
if args.min_bytes < 4 or args.min_bytes % 4:
    parser.error("--min-bytes must be a multiple of 4 bytes (float32 elements)")
if args.max_bytes < args.min_bytes or args.max_bytes > byte_count("1G"):
    parser.error("--max-bytes must be between --min-bytes and 1G")
try:
    link = parse_link(args.link) if args.link.strip() else None
except HostsError as error:
    parser.error(str(error))
if "RANK" not in os.environ:
    parser.error("start it on several hosts: make bench-hosts (or python -m "
                 "ddpcourse.cluster.hosts run --hosts 2 "
                 "scripts/experiments/lesson5_allreduce_hosts.py)")

import torch
import torch.distributed as dist

from ddpcourse.report import format_table, summary_line


def iterations(nbytes: int) -> int:
    """Many repeats for small messages, 2 for big ones: a slow link still ends in seconds."""
    return max(2, min(50, (4 << 20) // nbytes))


def main():
    rank = int(os.environ["RANK"])
    # gloo, whatever the hardware: the point is the bytes on the network.
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout))
    world = dist.get_world_size()
    if world < 2:
        raise SystemExit("error: an all-reduce between hosts needs at least 2 processes")

    # Where is each rank? The address it reaches the master from: on separate hosts, its
    # host's eth0; with nodes simulated on 127.0.0.1, 127.0.0.1 for all.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])))
        mine = probe.getsockname()[0]
    where = [None] * world
    dist.all_gather_object(where, mine)
    if rank == 0:
        hosts = sorted(set(where))
        print(f"W={world} processes on {len(hosts)} address(es): "
              + ", ".join(f"rank {r} {a}" for r, a in enumerate(where)), flush=True)
        if link:
            print(f"link: {link.text} ({link.bits_per_s / 8e9:.4g} GB/s nominal)", flush=True)
        elif len(hosts) == 1:
            print("link: none (one address: the bytes never leave this machine's loopback)",
                  flush=True)
        else:
            print("link: unshaped (veth pairs and a bridge: as fast as the CPUs copy)",
                  flush=True)

    def seconds_per_call(tensor, iters):
        dist.all_reduce(tensor)  # warm-up: the connections' buffers, the caches
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(tensor)
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # as slow as the slowest rank
        return elapsed.item() / iters

    sizes, size = [], args.min_bytes
    while size <= args.max_bytes:
        sizes.append(size)
        size *= 4
    bus_factor = 2 * (world - 1) / world
    rows = []
    for nbytes in sizes:
        x = torch.zeros(nbytes // 4)  # zeros: the sums stay finite however often we add
        t = seconds_per_call(x, iterations(nbytes))
        algbw = nbytes / t / 1e9
        rows.append({"bytes": nbytes, "time_s": t, "algbw_GBps": algbw,
                     "busbw_GBps": algbw * bus_factor})
        if rank == 0:
            print(f"  {human(nbytes):>7}: {t * 1e6:,.0f} us", flush=True)

    if rank == 0:
        print(f"\nall_reduce, gloo, W={world}: busbw = algbw * 2(W-1)/W = algbw * "
              f"{bus_factor:.2f}")
        print(format_table([{"size": human(r["bytes"]), "time us": f"{r['time_s'] * 1e6:,.1f}",
                             "algbw GB/s": f"{r['algbw_GBps']:.4f}",
                             "busbw GB/s": f"{r['busbw_GBps']:.4f}"} for r in rows]))
        largest = rows[-1]
        fields = {"world_size": world, "hosts": len(set(where)),
                  "link": link.rate if link else "unshaped",
                  "busbw_GBps": round(largest["busbw_GBps"], 4),
                  "at": human(largest["bytes"]).replace(" ", "")}
        if link:
            nominal = link.bits_per_s / 8e9
            fraction = largest["busbw_GBps"] / nominal
            print(f"\nbusbw at {human(largest['bytes'])}: {largest['busbw_GBps']:.4f} GB/s = "
                  f"{fraction:.2f} x the link's nominal {nominal:.4g} GB/s ({link.rate})")
            fields.update(nominal_GBps=round(nominal, 4), of_nominal=round(fraction, 3))
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps({"world_size": world, "where": where,
                                                   "link": link.text if link else "",
                                                   "rows": rows}, indent=1))
        print(summary_line(**fields))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
