"""Lesson 8 experiment: one training step of a 7B-shaped model on 1,024 GPUs, predicted.

    make lesson8-scale                  # its second step prints, then runs, this command:
    python scripts/experiments/lesson8_layouts.py --world-size 1024

No process group and no torch: arithmetic only, in well under a second. For each way of
laying the job out (pure data parallel, FSDP, HSDP, tensor parallel inside a node, a
pipeline across nodes, both) it predicts:

- compute: 6 x parameters x tokens FLOPs (forward 2, backward 4), shared out over the GPUs,
  at an H100's published dense bf16 rate times an assumed utilisation;
- communication: every collective the layout starts, from lesson 4's alpha-beta cost model
  of a ring, laid over the nodes as lesson 5's hierarchical all-reduce (a ring inside each
  node, then rings across nodes, every GPU with its own network card), at published link
  rates; and again at the alpha and beta of gloo on this machine's loopback (lesson 4);
- what of it a GPU waits for, the pipeline's bubble (S-1)/(M+S-1), and the model state per
  GPU from the ZeRO paper's flat count (ddpcourse.sharding.zero_stage_bytes), mixed precision.
"""

import json
import math
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

from ddpcourse.cli import ArgumentParser
from ddpcourse.report import format_table, summary_line
from ddpcourse.sharding import gb, transformer_shapes, zero_stage_bytes

WIDTH, FFN, VOCAB = 4096, 11008, 32000  # the 7B shape of transformer_shapes()
BF16 = 2  # bytes of every value that crosses a link: weights, gradients, activations
GPUS_PER_NODE = 8  # an HGX / DGX H100 node
# Published: H100 SXM dense bf16 tensor-core rate (1,979 TFLOP/s is the sparse figure), and
# its 80 GB of HBM3.
PEAK_FLOPS = 989e12
GPU_BYTES = 80e9


@dataclass(frozen=True)
class Link:
    """One hop of lesson 4's cost model: a message of m bytes takes alpha + m x beta."""

    alpha: float  # seconds per message
    beta: float  # seconds per byte, one direction

    def describe(self) -> str:
        return f"alpha {self.alpha * 1e6:,.1f} us, {1 / self.beta / 1e9:,.3g} GB/s"


# Published rates: NVLink 4 moves 900 GB/s per H100, 450 each way; an InfiniBand NDR port
# 400 Gb/s = 50 GB/s each way, and a DGX H100 has 8, one per GPU. Both alphas are assumed.
NVLINK = Link(alpha=2e-6, beta=1 / 450e9)
INFINIBAND = Link(alpha=5e-6, beta=1 / 50e9)
# Measured on this machine: lesson 4's table of gloo's all_reduce on 4 processes over
# loopback (lessons/lesson4/README.md, `make bench-allreduce`): (bytes, seconds).
LOOPBACK_WORLD, LOOPBACK_SMALL, LOOPBACK_LARGE = 4, (1 << 10, 5.8e-3), (256 << 20, 0.491)


def ring_link(world: int, small: tuple[int, float], large: tuple[int, float]) -> Link:
    """alpha and beta from two timed all-reduces, solving lesson 4's ring formula
    T = 2(W-1) alpha + 2(W-1)/W n beta at the two sizes."""
    (n1, t1), (n2, t2) = small, large
    per_byte = 2 * (world - 1) / world
    beta = (t2 - t1) / (per_byte * (n2 - n1))
    return Link(alpha=(t1 - per_byte * n1 * beta) / (2 * (world - 1)), beta=beta)


@dataclass(frozen=True)
class Group:
    """Where a process group's ranks sit: `per_node` of them share each of `nodes` nodes."""

    per_node: int
    nodes: int


def place(size: int, stride: int) -> Group:
    """The group of ranks r, r + stride, ..., r + (size-1) x stride, when consecutive ranks
    fill a node (torchrun's order): groups of stride 1 stay inside a node, wide ones cross."""
    per_node = min(size, max(1, GPUS_PER_NODE // stride))
    return Group(per_node, size // per_node)


def collective_seconds(n_bytes: float, group: Group, inside: Link, across: Link, passes: int,
                       messages: int = 1) -> float:
    """A ring collective of an n-byte tensor over a group, in `messages` equal pieces (one
    per FSDP unit or bucket): passes=1 for all-gather or reduce-scatter, 2 for all-reduce.
    Lesson 5's hierarchical form: a ring of the node's G ranks, G-1 steps of n/G bytes on the
    node's link, then rings across the N nodes, N-1 steps of n/(G N) bytes on each GPU's own
    card. (G = W or N = 1 gives lesson 4's one ring: 2(W-1) alpha + 2(W-1)/W n beta.)"""
    g, nodes = group.per_node, group.nodes
    node_part = (g - 1) * (messages * inside.alpha + n_bytes / g * inside.beta)
    net_part = (nodes - 1) * (messages * across.alpha + n_bytes / (g * nodes) * across.beta)
    return passes * (node_part + net_part)


@dataclass(frozen=True)
class Layout:
    """tp x pp x dp = W GPUs: tensor parallel innermost (consecutive ranks, one node), data
    parallel next, pipeline stages outermost. `sharding` says how the dp ranks hold the
    model state: "ddp" whole on each, "fsdp" cut over all dp, "hsdp" cut over a node's
    GPUS_PER_NODE ranks and whole on each node."""

    name: str
    tp: int
    pp: int
    dp: int
    sharding: str

    @property
    def shard(self) -> int:
        """Over how many ranks the model state is cut."""
        return {"ddp": 1, "fsdp": self.dp, "hsdp": GPUS_PER_NODE}[self.sharding]


def layouts(world: int) -> list[Layout]:
    g = GPUS_PER_NODE
    return [Layout(f"DDP {world}", 1, 1, world, "ddp"),
            Layout(f"FSDP {world}", 1, 1, world, "fsdp"),
            Layout(f"HSDP {g} x {world // g}", 1, 1, world, "hsdp"),
            Layout(f"TP {g} x DDP {world // g}", g, 1, world // g, "ddp"),
            Layout(f"TP {g} x FSDP {world // g}", g, 1, world // g, "fsdp"),
            Layout(f"PP 8 x DDP {world // 8}", 1, 8, world // 8, "ddp"),
            Layout(f"TP {g} x PP 4 x DDP {world // (4 * g)}", g, 4, world // (4 * g), "ddp")]


def why_not(layout: Layout, world: int, layers: int, sequences: int) -> str:
    """'' when the layout can run this job, else why it cannot."""
    if layout.dp < 1 or layout.tp * layout.pp * layout.dp != world:
        return f"{layout.tp * layout.pp} GPUs per replica do not divide {world}"
    if layout.sharding == "fsdp" and layout.dp == 1:
        return "FSDP over one replica is DDP"
    if layout.sharding == "hsdp" and layout.dp <= GPUS_PER_NODE:
        return "one node of replicas: HSDP is FSDP"
    if layers % layout.pp:
        return f"{layers} blocks do not split into {layout.pp} stages"
    if sequences % layout.dp:
        return f"{sequences} sequences do not split over {layout.dp} replicas"
    return ""


@dataclass
class Job:
    params: int
    layers: int
    sequences: int  # in the global batch
    sequence: int  # tokens per sequence
    compute_s: float  # per GPU per step, the same for every layout


def communication(layout: Layout, job: Job, inside: Link, across: Link) -> dict[str, float]:
    """Seconds of every collective one GPU takes part in during a step, by kind."""
    units = job.layers // layout.pp + 1  # one message per block, one for embedding and output
    state_bytes = BF16 * job.params / (layout.tp * layout.pp)  # this GPU's part of the model
    dp_group = place(layout.dp, layout.tp)
    forward = backward = 0.0
    if layout.shard == 1:  # DDP: one all-reduce of the gradients, in backward
        backward = collective_seconds(state_bytes, dp_group, inside, across, 2, units)
    else:  # FSDP: weights all-gathered in forward and again in backward, gradients scattered
        shard_group = place(layout.shard, layout.tp)
        forward = collective_seconds(state_bytes, shard_group, inside, across, 1, units)
        backward = 2 * forward
        if layout.shard < layout.dp:  # HSDP: the scattered pieces all-reduced across nodes
            replicas = place(layout.dp // layout.shard, layout.tp * layout.shard)
            backward += collective_seconds(state_bytes / layout.shard, replicas, inside,
                                           across, 2, units)
    micro_batches = job.sequences // layout.dp  # one sequence per micro-batch
    activation = BF16 * job.sequence * WIDTH  # one sequence's hidden states
    tensor = 0.0
    if layout.tp > 1:  # two all-reduces per block in forward, two in backward, per sequence
        count = 4 * (job.layers // layout.pp) * micro_batches
        tensor = collective_seconds(count * activation, place(layout.tp, 1), inside, across,
                                    2, count)
    pipeline = pipeline_waits = 0.0
    if layout.pp > 1:  # each micro-batch's activations forward, their gradients back
        hop = across if place(layout.pp, layout.tp * layout.dp).per_node == 1 else inside
        one = hop.alpha + activation * hop.beta
        pipeline = 2 * micro_batches * one
        pipeline_waits = 2 * (layout.pp - 1) * one  # filling and draining: nothing to hide
    return {"forward": forward, "backward": backward, "tensor": tensor, "pipeline": pipeline,
            "pipeline_waits": pipeline_waits,
            "total": forward + backward + tensor + pipeline}


def predict_step(layout: Layout, job: Job, loopback: Link) -> dict:
    """Seconds of compute, communication, waiting and bubble, and GB of state, per GPU."""
    comm = communication(layout, job, NVLINK, INFINIBAND)
    micro_batches = job.sequences // layout.dp
    forward_s, backward_s = job.compute_s / 3, job.compute_s * 2 / 3
    # Data-parallel traffic hides behind the compute of its own pass; a pipeline's gradients
    # are whole only after the last micro-batch, so only that one's backward hides them.
    # Tensor-parallel all-reduces block the next layer: all of them are waited for.
    hiding = backward_s / micro_batches if layout.pp > 1 else backward_s
    exposed = (max(0.0, comm["forward"] - forward_s) + max(0.0, comm["backward"] - hiding)
               + comm["tensor"] + comm["pipeline_waits"])
    stages = layout.pp
    bubble = (job.compute_s + comm["tensor"]) * (stages - 1) / micro_batches if stages > 1 else 0
    state = zero_stage_bytes(math.ceil(job.params / (layout.tp * layout.pp)), layout.shard,
                             "ddp" if layout.shard == 1 else "zero3", "mixed", "adam")["total"]
    return {"comm": comm["total"], "exposed": exposed, "bubble": bubble,
            "step": job.compute_s + exposed + bubble, "state": state,
            "micro_batches": micro_batches,
            "comm_loopback": communication(layout, job, loopback, loopback)["total"]}


def say(text: str) -> None:
    """One statement, wrapped at 100 columns, its continuation lines indented."""
    print(textwrap.fill(text, width=100, subsequent_indent="  "))


def exponent(x: float) -> str:
    return f"{x:.3e}".replace("e+", "e")


def parse_args():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=1024,
                        help=f"GPUs, {GPUS_PER_NODE} per node (default 1024)")
    parser.add_argument("--layers", type=int, default=32, help="decoder blocks (7B: 32)")
    parser.add_argument("--batch-tokens", type=int, default=4 << 20,
                        help="tokens in the global batch of one step (default 4,194,304)")
    parser.add_argument("--sequence", type=int, default=4096, help="tokens per sequence")
    parser.add_argument("--utilisation", type=float, default=0.4,
                        help="share of the peak FLOP rate reached (assumed; default 0.4)")
    parser.add_argument("--loopback", default="", metavar="JSON",
                        help="a runs/lesson4_allreduce_W*.json of your own `make "
                             "bench-allreduce` for the gloo contrast (default: lesson 4's table)")
    args = parser.parse_args()
    if args.world_size < GPUS_PER_NODE or args.world_size % GPUS_PER_NODE:
        parser.error(f"--world-size must be a multiple of {GPUS_PER_NODE} (whole nodes)")
    if args.layers < 1 or args.sequence < 1 or args.batch_tokens % args.sequence \
            or args.batch_tokens < args.sequence:
        parser.error("--layers must be at least 1; --batch-tokens a multiple of --sequence")
    if not 0 < args.utilisation <= 1:
        parser.error("--utilisation must be above 0 and at most 1")
    if args.loopback:
        try:
            bench = json.loads(Path(args.loopback).read_text())
            rows = sorted((r["bytes"], r["time_s"]) for r in bench["rows"]
                          if r["method"] == "all_reduce")
            if len(rows) < 2 or rows[0][0] == rows[-1][0]:
                raise ValueError
            args.loopback = (bench["world_size"], rows[0], rows[-1])
        except (OSError, ValueError, KeyError, TypeError, IndexError):
            parser.error(f"--loopback {args.loopback}: not a lesson 4 benchmark JSON with "
                         "all_reduce at two sizes or more")
    return args


def main():
    args = parse_args()
    started = time.perf_counter()
    world, nodes = args.world_size, args.world_size // GPUS_PER_NODE
    params = sum(math.prod(s) for s in transformer_shapes(args.layers, WIDTH, FFN, VOCAB))
    sequences = args.batch_tokens // args.sequence
    flops = 6 * params * args.batch_tokens
    job = Job(params, args.layers, sequences, args.sequence,
              compute_s=flops / world / (PEAK_FLOPS * args.utilisation))
    source = args.loopback or (LOOPBACK_WORLD, LOOPBACK_SMALL, LOOPBACK_LARGE)
    loopback = ring_link(*source)

    say(f"{params / 1e9:.2f} B parameters ({args.layers} blocks of width {WIDTH}); one step of "
          f"{args.batch_tokens:,} tokens ({sequences:,} sequences of {args.sequence:,}) on "
          f"{world:,} GPUs ({nodes} node{'s' * (nodes > 1)} of {GPUS_PER_NODE})")
    say(f"compute: 6 x {params:,} x {args.batch_tokens:,} = {exponent(flops)} FLOP, "
          f"{exponent(flops / world)} per GPU, at {PEAK_FLOPS / 1e12:.0f} TFLOP/s (H100 SXM "
          f"dense bf16, published) x {args.utilisation:g} (assumed) = {job.compute_s:.3f} s")
    say(f"links: NVLink 4 inside a node, {NVLINK.describe()}; InfiniBand NDR across, one card "
          f"per GPU, {INFINIBAND.describe()} (rates published, alphas assumed)")
    say(f"gloo links: {loopback.describe()}, solved from all_reduce on {source[0]} processes "
          f"over this machine's loopback: {source[1][0]:,} B in {source[1][1] * 1e3:.3g} ms, "
          f"{source[2][0]:,} B in {source[2][1] * 1e3:.3g} ms "
          f"({args.loopback and 'your --loopback' or 'lesson 4'})")

    rows, skipped = [], []
    for layout in layouts(world):
        reason = why_not(layout, world, args.layers, sequences)
        if reason:
            skipped.append(f"{layout.name}: {reason}")
            continue
        p = predict_step(layout, job, loopback)
        rows.append({"layout": layout.name, "S": layout.pp,
                     "M": p["micro_batches"] if layout.pp > 1 else "-",
                     "compute s": f"{job.compute_s:.3f}", "comm s": f"{p['comm']:.3f}",
                     "exposed s": f"{p['exposed']:.3f}", "bubble s": f"{p['bubble']:.3f}",
                     "step s": f"{p['step']:.3f}", "GB/GPU": gb(p["state"]),
                     "fits 80 GB": "yes" if p["state"] <= GPU_BYTES else "no",
                     "comm s, gloo links": f"{p['comm_loopback']:,.1f}",
                     "_sort": (p["step"], p["comm"])})
    best = min((r for r in rows if r["fits 80 GB"] == "yes"), key=lambda r: r["_sort"],
               default=None)
    print(format_table([{k: v for k, v in r.items() if k != "_sort"} for r in rows]))
    for line in skipped:
        print(f"skipped: {line}")
    say(
        "exposed: what a GPU waits for. Data-parallel collectives hide behind the compute of "
        "their own pass (forward 1/3, backward 2/3; in a pipeline only the last micro-batch's "
        "backward); tensor-parallel all-reduces and the pipeline's filling and draining hops "
        "hide behind nothing. bubble: (S-1)/(M+S-1) of the pipeline's time, one sequence per "
        "micro-batch.")
    say(
        "GB/GPU: weights, gradients and Adam's state, mixed precision (2 + 2 + 12 bytes per "
        "parameter), flat shards; activations come on top and decide the micro-batch.")
    print(summary_line(layouts=len(rows), world_size=world,
                       best=best["layout"].replace(" x ", "x").replace(" ", "_") if best
                       else "none",
                       step_s=best["step s"] if best else "-",
                       gb_per_gpu=best["GB/GPU"] if best else "-",
                       wall_s=round(time.perf_counter() - started, 2)))


if __name__ == "__main__":
    main()
