"""Lesson 8 experiment: rank 0 of a 1,024-rank FSDP2 job, run in one process on a CPU.

    make lesson8-scale                          # prints, then runs, this command:
    python scripts/experiments/lesson8_scale.py --world-size 1024

torch's "fake" process-group backend answers every collective at once and sends nothing;
the tensors stay real. So one process can stand in for rank 0 of a job of any size: it
builds a 7B-shaped decoder (ddpcourse.sharding.transformer_shapes) on the meta device, which
holds shapes and no memory; shards it with fully_shard over a mesh of W ranks, one unit per
block; materialises only its own pieces (to_empty, then initialises them); and takes one
real Adam step on a few tokens. It counts the bytes it then holds, by storage, beside
ddpcourse.sharding.predict for rank 0, and the peak of its resident memory during the step;
torch's FSDP2 memory tracker watches the same step and reports both, by kind of tensor.
The fake all-gather fills every rank's slot with a copy of rank 0's own piece: the arithmetic
of a step runs on every byte, its numbers mean nothing, and only the memory is measured.
"""

import contextlib
import re
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

# private: torch's memory estimators have no public home yet (torch.distributed._tools)
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.utils.checkpoint import checkpoint

from ddpcourse.cli import ArgumentParser
from ddpcourse.report import format_table, summary_line
from ddpcourse.sharding import GB, held_bytes, predict, shapes_of, transformer_shapes


class Block(nn.Module):
    """One decoder block, the shapes of transformer_shapes: attention (query, key, value,
    output) and a gated MLP, each behind an RMS norm."""

    def __init__(self, width: int, ffn: int, heads: int):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(width, width, bias=False) for _ in range(4))
        self.gate, self.up = nn.Linear(width, ffn, bias=False), nn.Linear(width, ffn, bias=False)
        self.down = nn.Linear(ffn, width, bias=False)
        self.norm1, self.norm2 = nn.RMSNorm(width), nn.RMSNorm(width)

    def forward(self, x):
        b, t, w = x.shape
        h = self.norm1(x)
        q, k, v = (m(h).view(b, t, self.heads, -1).transpose(1, 2)
                   for m in (self.q, self.k, self.v))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(attended.transpose(1, 2).reshape(b, t, w))
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Decoder(nn.Module):
    def __init__(self, layers: int, width: int, ffn: int, vocab: int, heads: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(Block(width, ffn, heads) for _ in range(layers))
        self.norm = nn.RMSNorm(width)
        self.out = nn.Linear(width, vocab, bias=False)
        self.checkpointed = False  # lesson8_activations.py: each block under checkpoint

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if self.checkpointed else block(x)
        return self.out(self.norm(x))


def resident_mb(field: str) -> float:
    """VmRSS (now) or VmHWM (the peak so far) of this process, from /proc, in MB."""
    with open("/proc/self/status") as f:
        kib = int(re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.M).group(1))
    return kib * 1024 / 1e6  # /proc's "kB" are KiB: 1e9 bytes written read as 977,000 kB


# The tracker's names for the kinds of tensor that are a rank's state once a step is over.
TRACKED_STATE = {"params": "Sharded Param", "grads": "Sharded Grad", "optimizer": "OptState"}


def tracker_bytes(tracker: FSDPMemTracker, when: str) -> dict[str, int]:
    """The tracker's "current" or "peak" snapshot of the CPU: bytes by kind, and "Total"."""
    snapshot = tracker.get_tracker_snapshot(when).get(torch.device("cpu"), {})
    return {getattr(kind, "value", kind): n for kind, n in snapshot.items()}  # enum -> name


def parse_args():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=1024, help="W: the ranks of the job")
    parser.add_argument("--layers", type=int, default=32, help="decoder blocks (7B: 32)")
    parser.add_argument("--tokens", type=int, default=16, help="tokens in the step's batch")
    parser.add_argument("--no-tracker", action="store_true",
                        help="run the step without torch's FSDPMemTracker, to see that it "
                             "changes neither the bytes nor the peak measured")
    args = parser.parse_args()
    if not 1 <= args.world_size <= 65536 or args.layers < 1 or args.tokens < 1:
        parser.error("--world-size must be 1 to 65536; --layers and --tokens at least 1")
    return args


def main():
    args = parse_args()
    started = time.perf_counter()
    # One thread: most of this step is the kernel handing out fresh pages (measured: 77 s of
    # system time beside 36 s of user time), which a second thread does not speed up; and a
    # second thread waiting for a core that another program holds made the step ten times
    # slower on a busy 2-core machine (130 s quiet, 211 s with both cores busy, with one).
    torch.set_num_threads(1)
    width, ffn, vocab, heads = 4096, 11008, 32000, 32  # the 7B shape
    # One process is rank 0 of W: a store in this process's memory, and the fake backend.
    dist.init_process_group("fake", rank=0, world_size=args.world_size, store=dist.HashStore())
    # A group of its own for the mesh, as in scripts/lesson8_fsdp.py.
    mesh = init_device_mesh("cpu", (args.world_size,), backend_override={0: "fake"})

    with torch.device("meta"):  # shapes only: a 7B model here would be 27 GB of fp32
        model = Decoder(args.layers, width, ffn, vocab, heads)
    shapes = shapes_of(model)
    assert shapes == transformer_shapes(args.layers, width, ffn, vocab), "not the 7B shapes"
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)  # the root unit: embedding, final norm, output
    before = resident_mb("VmRSS")
    model.to_empty(device="cpu")  # memory for this rank's pieces only
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():  # DTensors: initialise the local piece
            local = p.to_local()
            local.normal_(0, 0.02) if local.dim() > 1 else local.fill_(1.0)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)

    tick = time.perf_counter()
    tokens = torch.randint(vocab, (1, args.tokens))
    # torch's estimate of the same step: a dispatch mode that sees every op and keeps weak
    # references to every storage, labelled by FSDP's phase when it was made
    tracker = None if args.no_tracker else FSDPMemTracker(model, optimizer)
    with contextlib.nullcontext() if tracker is None else tracker:
        logits = model(tokens)
        loss = F.cross_entropy(logits.view(-1, vocab), tokens.view(-1))
        loss.backward()  # each block gathered again, its gradients reduce-scattered
        optimizer.step()
    step_s = time.perf_counter() - tick
    peak = resident_mb("VmHWM") - before

    held = held_bytes(model, optimizer)
    predicted = predict(shapes, args.world_size, "fsdp", "adam")[0]
    count = sum(p.numel() for p in model.parameters())
    rows = [{"part": part, "held MB": f"{held[part] / 1e6:.1f}",
             "predicted MB": f"{predicted[part] / 1e6:.1f}"}
            for part in ("params", "grads", "optimizer", "total")]
    if tracker is not None:
        now = tracker_bytes(tracker, "current")
        state = {part: now.get(kind, 0) for part, kind in TRACKED_STATE.items()}
        state["total"] = sum(state.values())
        for row in rows:
            row["tracker MB"] = f"{state[row['part']] / 1e6:.1f}"
    worst = max(abs(held[k] - predicted[k]) / max(predicted[k], 1) for k in held)
    print(f"rank 0 of {args.world_size}: {count / 1e9:.2f} B parameters ({args.layers} blocks of "
          f"width {width}), fp32, Adam; one step on {args.tokens} tokens in {step_s:.1f} s")
    print(format_table(rows))
    tracked = {}
    if tracker is not None:
        at_peak = tracker_bytes(tracker, "peak")
        print("\nthe step's peak as FSDPMemTracker saw it (storages alive at its largest moment):")
        print(format_table([{"kind": kind, "MB": f"{n / 1e6:.1f}"}
                            for kind, n in at_peak.items() if n >= 50_000]))
        tracked = {"tracker_gb": round(state["total"] / GB, 4),
                   "tracker_peak_gb": round(at_peak["Total"] / GB, 2)}
    print(f"peak resident memory during the step, above the model-less process: {peak:.0f} MB "
          f"(the state above, the gathered unit being run, its gradients, activations, and "
          f"the allocator's spare)")
    print(summary_line(world_size=args.world_size, params_b=round(count / 1e9, 2),
                       measured_gb=round(held["total"] / GB, 4),
                       predicted_gb=round(predicted["total"] / GB, 4),
                       worst_diff=f"{worst:.1e}", peak_gb=round(peak / 1e3, 2), **tracked,
                       wall_s=round(time.perf_counter() - started, 1)))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
