"""What each collective does to every rank's data: a model in plain Python.

The model needs no process group: it moves numbers between lists, one list per rank. The
lesson 4 figures are drawn from it (ddpcourse/figures/collectives.py), and
scripts/lesson4_collectives.py checks the real collectives against it, so the pictures and
torch.distributed cannot drift apart.

A rank's *state* is what it holds before or after the call:

    [[1, 2]]                one tensor (one chunk of numbers)
    [[1, 2], [11, 12]]      a list of tensors (gather's output, scatter's input, ...)
    None                    no buffer at all (gather's output on a rank that is not dst)
    NOT_DEFINED             a buffer whose contents the call does not define (reduce on non-dst)

The pictures number values so that the tens digit is the rank they came from: rank r starts
with 10r+1, 10r+2, ... (this works up to 9 ranks).
"""

from __future__ import annotations

from dataclasses import dataclass

NOT_DEFINED = "not defined"

# name -> (the call, as a student writes it; what it does, in one line)
COLLECTIVES = {
    "broadcast": ("dist.broadcast(x, src={root})",
                  "rank {root}'s tensor is copied into every rank's tensor"),
    "reduce": ("dist.reduce(x, dst={root}, op={OP})",
               "the element-wise {op} of every rank's tensor lands on rank {root} only"),
    "all_reduce": ("dist.all_reduce(x, op={OP})",
                   "every rank ends with the element-wise {op} of all the tensors"),
    "gather": ("dist.gather(x, gather_list, dst={root})",
               "rank {root} collects every rank's tensor, in rank order"),
    "all_gather": ("dist.all_gather(tensor_list, x)",
                   "every rank collects every rank's tensor, in rank order"),
    "scatter": ("dist.scatter(x, scatter_list, src={root})",
                "rank {root} hands piece i of its list to rank i"),
    "reduce_scatter": ("dist.reduce_scatter(x, input_list, op={OP})",
                       "piece i of every rank's list is combined ({op}) and lands on rank i"),
    "send_recv": ("dist.isend(x, dst=(rank+1) % W); dist.irecv(y, src=(rank-1) % W)",
                  "a ring shift: every rank sends to its right and receives from its left"),
    "barrier": ("dist.barrier()",
                "no data moves: every rank waits until the last one has arrived"),
}
OPS = {"sum": "SUM", "avg": "AVG", "max": "MAX", "min": "MIN", "product": "PRODUCT"}


@dataclass(frozen=True)
class Cell:
    """One number and the ranks whose data went into it."""

    value: float
    sources: frozenset


def rank_values(rank: int, count: int = 2, first: int = 1) -> list[float]:
    """The numbers rank `rank` starts with in the pictures: 10*rank + first, + first + 1, ..."""
    return [float(10 * rank + first + i) for i in range(count)]


def starting_states(name: str, world_size: int, root: int = 0) -> list:
    """What every rank holds before `name`, as the lesson's pictures and script set it up."""
    _check(name, world_size, root)
    if name == "scatter":
        pieces = [rank_values(root, 2, first=2 * i + 1) for i in range(world_size)]
        return [pieces if r == root else None for r in range(world_size)]
    if name == "reduce_scatter":
        return [[rank_values(r, 1, first=i + 1) for i in range(world_size)]
                for r in range(world_size)]
    if name == "barrier":
        return [None] * world_size
    return [[rank_values(r)] for r in range(world_size)]


def _check(name: str, world_size: int, root: int) -> None:
    if name not in COLLECTIVES:
        raise ValueError(f"unknown collective {name!r}; known: {', '.join(COLLECTIVES)}")
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world size must be a positive int, got {world_size!r}")
    if not 0 <= root < world_size:
        raise ValueError(f"root {root} is not a rank of a world of {world_size}")
    if name == "send_recv" and world_size < 2:
        raise ValueError("send/recv needs at least two ranks")


def cells_of(state, rank: int):
    if state is None or state == NOT_DEFINED:
        return state
    return [[v if isinstance(v, Cell) else Cell(float(v), frozenset({rank})) for v in chunk]
            for chunk in state]


def _combine(cells: list[Cell], op: str) -> Cell:
    values = [c.value for c in cells]
    if op in ("max", "min"):
        best = max(values) if op == "max" else min(values)
        sources = frozenset().union(*(c.sources for c in cells if c.value == best))
        return Cell(best, sources)
    if op == "sum":
        value = sum(values)
    elif op == "avg":
        value = sum(values) / len(values)
    elif op == "product":
        value = 1.0
        for v in values:
            value *= v
    else:
        raise ValueError(f"unknown reduction {op!r}; known: {', '.join(OPS)}")
    return Cell(value, frozenset().union(*(c.sources for c in cells)))


def _reduce_chunks(chunks: list[list[Cell]], op: str) -> list[Cell]:
    sizes = {len(c) for c in chunks}
    if len(sizes) != 1:
        raise ValueError(f"tensors of different sizes {sorted(sizes)} cannot be reduced")
    return [_combine([chunk[i] for chunk in chunks], op) for i in range(len(chunks[0]))]


def simulate(name: str, before: list, root: int = 0, op: str = "sum") -> list:
    """Every rank's state after collective `name`, given every rank's state before it.

    `before` holds one state per rank (see the module docstring); plain numbers are taken to
    come from the rank that holds them. Returns states made of Cells.
    """
    world = len(before)
    _check(name, world, root)
    if op not in OPS:
        raise ValueError(f"unknown reduction {op!r}; known: {', '.join(OPS)}")
    state = [cells_of(s, r) for r, s in enumerate(before)]
    first = [s[0] if s else None for s in state]  # the one tensor of each rank, where it has one
    if name == "broadcast":
        return [[list(first[root])] for _ in range(world)]
    if name == "reduce":
        total = _reduce_chunks(first, op)
        return [[total] if r == root else NOT_DEFINED for r in range(world)]
    if name == "all_reduce":
        total = _reduce_chunks(first, op)
        return [[list(total)] for _ in range(world)]
    if name == "gather":
        return [[list(c) for c in first] if r == root else None for r in range(world)]
    if name == "all_gather":
        return [[list(c) for c in first] for _ in range(world)]
    if name == "scatter":
        pieces = state[root]
        if pieces is None or len(pieces) != world:
            raise ValueError(f"scatter needs a list of {world} tensors on rank {root}")
        return [[list(pieces[r])] for r in range(world)]
    if name == "reduce_scatter":
        if any(s is None or len(s) != world for s in state):
            raise ValueError(f"reduce_scatter needs a list of {world} tensors on every rank")
        return [[_reduce_chunks([state[q][r] for q in range(world)], op)]
                for r in range(world)]
    if name == "send_recv":
        return [[list(first[(r - 1) % world])] for r in range(world)]
    return [None] * world  # barrier


def values(states: list) -> list:
    """The numbers of some states (Cells -> floats), keeping None and NOT_DEFINED."""
    return [s if s is None or s == NOT_DEFINED else
            [[c.value if isinstance(c, Cell) else float(c) for c in chunk] for chunk in s]
            for s in states]


def format_values(state) -> str:
    """A state as a short string: '[1, 2]', '[1, 2] [11, 12]', '-' (no buffer)."""
    if state is None:
        return "-"
    if state == NOT_DEFINED:
        return NOT_DEFINED
    return " ".join("[" + ", ".join(format_number(v) for v in chunk) + "]" for chunk in state)


def format_number(v) -> str:
    v = v.value if isinstance(v, Cell) else float(v)
    return str(int(v)) if v == int(v) and abs(v) < 1e15 else f"{v:.4g}"


def describe(name: str, root: int = 0, op: str = "sum") -> tuple[str, str]:
    """(the call, what it does) for `name`, filled in with the root and the reduction."""
    call, says = COLLECTIVES[name]
    fields = {"root": root, "op": op, "OP": f"dist.ReduceOp.{OPS[op]}"}
    return call.format(**fields), says.format(**fields)


# --- ring all-reduce, step by step --------------------------------------------------------

def ring_allreduce_steps(world_size: int) -> list[dict]:
    """The ring all-reduce of a tensor cut into W chunks, one dict per stage.

    Each stage has a label, and per rank the set of ranks whose chunk c is summed into what
    it holds (`held[rank][c]`), plus the chunk every rank received in that step. Steps
    1..W-1 are the reduce-scatter phase, steps W..2W-2 the all-gather phase.
    """
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world size must be a positive int, got {world_size!r}")
    w = world_size
    held = [[frozenset({r}) for _ in range(w)] for r in range(w)]
    stages = [{"label": "start", "held": [list(h) for h in held], "received": [None] * w}]
    for step in range(w - 1):  # reduce-scatter: rank r sends chunk r-step, adds chunk r-step-1
        sent = [held[r][(r - step) % w] for r in range(w)]
        received = []
        for r in range(w):
            c = (r - step - 1) % w
            held[r][c] = held[r][c] | sent[(r - 1) % w]
            received.append(c)
        stages.append({"label": f"reduce-scatter {step + 1}", "held": [list(h) for h in held],
                       "received": received})
    for step in range(w - 1):  # all-gather: rank r sends its finished chunk r+1-step onward
        sent = [held[r][(r + 1 - step) % w] for r in range(w)]
        received = []
        for r in range(w):
            c = (r - step) % w
            held[r][c] = sent[(r - 1) % w]
            received.append(c)
        stages.append({"label": f"all-gather {step + 1}", "held": [list(h) for h in held],
                       "received": received})
    return stages


# --- pictures ------------------------------------------------------------------------------
