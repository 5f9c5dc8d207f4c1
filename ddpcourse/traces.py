"""What torch records, read back. Lesson 7's profiler traces: the phases of a step and its
all-reduces, from the Chrome trace torch.profiler writes on every rank, and how much of the
communication overlapped backward (scripts/experiments/lesson7_overlap_bench.py;
ddpcourse/figures/speed.py draws it). The flight recorder: the last collectives a process
started (lesson 6's stuck rank, lesson 8's traffic per step).
"""

from __future__ import annotations

import json

# The record_function markers the overlap experiment puts around each phase of a step.
MARKERS = ("forward", "backward", "wait for all-reduces", "optimizer step")


def spans_of_trace(path) -> dict:
    """The step's phases and its all-reduces, from a torch.profiler Chrome trace.

    Returns {"compute": [[name, start_ms, end_ms], ...], "comm": [[name, start_ms, end_ms],
    ...]}, times on the trace's own clock (processes on one machine share it). The phases are
    the record_function markers of MARKERS. An all-reduce is an event named "<backend>:all_reduce":
    gloo's run on its worker threads for as long as the collective takes. On a
    GPU the transfer is a kernel: "nccl" kernels are taken instead of the CPU's short
    enqueue events when the trace has them, and the phases are then the GPU kernels that
    each marker launched (matched by the profiler's correlation ids).
    """
    with open(path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]

    def span(e):
        return [e["ts"] / 1e3, (e["ts"] + e.get("dur", 0)) / 1e3]

    markers = [e for e in events if e["name"] in MARKERS and e.get("cat") == "user_annotation"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    nccl = [e for e in kernels if "nccl" in e["name"].lower()]
    if nccl:  # a GPU: where the kernels ran, not where the CPU launched them
        launches = {e["args"].get("correlation"): e for e in events
                    if e.get("cat") in ("cuda_runtime", "cuda_driver")
                    and "correlation" in e.get("args", {})}
        compute = []
        for marker in markers:
            lo, hi = span(marker)
            ran = [span(k) for k in kernels if k not in nccl and (launch := launches.get(
                k["args"].get("correlation"))) and lo <= launch["ts"] / 1e3 <= hi]
            if ran:
                compute.append([marker["name"], min(s for s, _ in ran), max(e for _, e in ran)])
        comm = [["all_reduce", *span(k)] for k in nccl]
    else:
        compute = [[e["name"], *span(e)] for e in markers]
        comm = [["all_reduce", *span(e)] for e in events if e["name"].endswith(":all_reduce")]
    return {"compute": sorted(compute, key=lambda s: s[1]),
            "comm": sorted(comm, key=lambda s: s[1])}


def overlap_of(spans: dict) -> dict:
    """How many all-reduces started before backward ended, and what share of the all-reduce
    time fell inside backward: {"count", "early", "hidden"}."""
    backward = [s for s in spans["compute"] if s[0] == "backward"]
    if not backward or not spans["comm"]:
        return {"count": len(spans["comm"]), "early": 0, "hidden": 0.0}
    start, end = backward[0][1], backward[0][2]
    early = sum(1 for _, s, _ in spans["comm"] if s < end)
    total = sum(e - s for _, s, e in spans["comm"])
    inside = sum(max(0.0, min(e, end) - max(s, start)) for _, s, e in spans["comm"])
    return {"count": len(spans["comm"]), "early": early, "hidden": inside / max(total, 1e-9)}


# --- the flight recorder --------------------------------------------------------------------

def flight_recorder() -> list[dict]:
    """The collectives this process started that torch's flight recorder kept, oldest first,
    one dict each as torch records it: "profiling_name" ("gloo:all_reduce"),
    "collective_seq_id", "input_sizes" and more. It keeps the last TORCH_FR_BUFFER_SIZE of
    them, a variable read when the first process group is created (unset: torch keeps a
    default number; 3 all-reduces of one gloo process were all kept, torch 2.14.1)."""
    import pickle

    # Private: torch 2.14 has no public reader of this process's own flight recorder. The
    # public ways reach it from outside: torch.distributed.debug.start_debug_server (an
    # experimental HTTP server; aiohttp, Jinja2) and torch.distributed.flight_recorder (which
    # analyses dumps written to files).
    from torch._C._distributed_c10d import _dump_fr_trace

    trace = pickle.loads(_dump_fr_trace(includeCollectives=True, includeStackTraces=False,
                                        onlyActive=False))
    return trace.get("entries", [])
