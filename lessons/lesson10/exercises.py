"""Lesson 10 exercises: the three mechanisms under every composed run of this lesson, by hand.
A mesh: a rank's coordinates and every dimension's process groups; ring attention: one rank's
block of queries against the whole sequence, the keys and values coming round a ring;
expert parallelism: tokens sent to the ranks of their experts and back.

Replace each `raise NotImplementedError` with your code, then grade one exercise at a time:

    make grade LESSON=10                                  # all of lesson 10, with a score table
    .venv/bin/pytest tests/grading -m l10_ring_attention   # one exercise

Your code runs in a sandboxed process of its own: mesh_coordinates there alone; the others
there in a world of one, then in torchrun jobs of 3 and 4 processes, in the world (and
ring_attention and moe_dispatch in sub-groups whose group ranks are not global ranks), where
every collective and message your code starts is recorded. Write them with torch alone:
torch's DeviceMesh may help you check your groups, but the graded groups must carry the
timeout asked for.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import torch
import torch.distributed as dist  # noqa: F401  (you will need it)
import torch.nn as nn

# --- l10_mesh_groups -----------------------------------------------------------------------


def mesh_coordinates(rank: int, shape: Sequence[int]) -> tuple[int, ...]:
    """Exercise l10_mesh_groups (1 of 2): where `rank` sits in a mesh of `shape`.

    The ranks 0..prod(shape)-1 are written into the mesh row-major, as init_device_mesh
    writes them: the last dimension changes fastest. So in a (dp, tp) = (2, 3) mesh rank 4 is
    at (1, 1), and in a (pp, dp, tp) = (2, 2, 2) mesh rank 5 is at (1, 0, 1). Return the
    coordinates as a tuple of ints, one per dimension (a dimension of size 1 has coordinate
    0). Raise ValueError, in one line, for an empty shape, a size below 1, or a rank outside
    0..prod(shape)-1.
    """
    raise NotImplementedError("l10_mesh_groups")


def mesh_groups(shape: Sequence[int], names: Sequence[str],
                timeout: timedelta) -> dict[str, dist.ProcessGroup]:
    """Exercise l10_mesh_groups (2 of 2): every dimension's process groups, in a running job.

    Called on every rank of the world (init_process_group done, W ranks). The mesh has
    `shape` (its product must be W) and one name per dimension, e.g. (2, 2) and ("dp", "tp").
    A rank's group in dimension d holds the ranks whose coordinates differ from its own in
    dimension d only: in a (dp, tp) = (2, 2) mesh rank 1's "tp" group is {0, 1} (its row) and
    its "dp" group {1, 3} (its column).

    Return {name: this rank's process group in that dimension}, each group made with
    `timeout` (a group made without one waits 30 minutes on gloo, whatever
    init_process_group was told). Remember what dist.new_group asks: every rank takes part in
    the creation of every group, its own or not, in the same order. Raise ValueError, in one
    line and before making any group, when the shape's product is not W, or the names are
    not one distinct name per dimension.
    """
    raise NotImplementedError("l10_mesh_groups")


# --- l10_ring_attention --------------------------------------------------------------------


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group=None,
                   causal: bool = False) -> torch.Tensor:
    """Exercise l10_ring_attention: attention over a sequence cut into blocks, one per rank.

    q, k and v are this rank's block of a sequence, shape (..., block, head_dim) (for example
    batch, heads, block, head_dim): group rank r of `group` (None: the world) holds positions
    r x block to (r + 1) x block - 1. Return this rank's rows of what attention gives in one
    process on the whole sequence,
        softmax(Q_r K^T / sqrt(head_dim)) V      (causal: position i sees positions <= i),
    as torch.nn.functional.scaled_dot_product_attention(Q, K, V, is_causal=causal) does,
    without ever holding the whole K and V: pass the K and V blocks around the ring (send to
    group rank r + 1, receive from r - 1, wrapping round; W - 1 hops, each block moving one
    step per hop) and merge each block's scores into the result with the online softmax
    (keep each row's running maximum and running sum of exponentials, rescaling what you have
    when the maximum grows). Scores can be large: exponentials of unshifted scores overflow.

    With causal=True, query block r needs key blocks 0..r only: compute no others (the
    grader counts the matrix products), but keep passing every block on, since the ranks
    after you need it. Use send and recv only (dist.send/recv, isend/irecv, or
    batch_isend_irecv: every collective raises while this runs), and mind that their dst and
    src are global ranks. Raise ValueError, in one line and before any message, when q, k and
    v have different shapes.
    """
    raise NotImplementedError("l10_ring_attention")


# --- l10_moe_dispatch ----------------------------------------------------------------------


def moe_dispatch(tokens: torch.Tensor, expert_ids: torch.Tensor, experts: Sequence[nn.Module],
                 num_experts: int, group=None) -> torch.Tensor:
    """Exercise l10_moe_dispatch: expert parallelism's trip, there and back.

    `tokens` (T, d) are this rank's tokens and `expert_ids` (T,) (int64) the expert each one
    goes to, in 0..num_experts-1. The experts are spread over the W ranks of `group` (None:
    the world): group rank r holds experts r x E/W to (r + 1) x E/W - 1, and `experts` are
    this rank's, in that order (E = num_experts). Return (T, d_out): row t is
    experts[expert_ids[t]](tokens[t]), wherever that expert lives. The trip:
      1. order this rank's tokens by expert, so each destination's rows are contiguous;
      2. tell every rank how many rows it will get from you (an all_to_all_single of counts:
         the row split sizes differ from rank to rank and are not known in advance);
      3. send the rows (all_to_all_single with those uneven splits);
      4. run each local expert on the rows that came for it;
      5. send the results back the same way, and undo step 1's order.
    Some ranks may have no tokens, some experts none. Move the rows that must move and no
    more (no padding to equal splits, no copies for ranks that do not need them).

    It must be differentiable: a backward from the result reaches `tokens` and every expert's
    parameters, on the rank that holds it, as in one process: dist.all_to_all_single is not
    differentiable; a small torch.autograd.Function around it is (its backward the same
    exchange with the split sizes swapped), as is torch.distributed.nn.functional's
    all_to_all_single, which torch 2.14 marks deprecated.
    Raise ValueError, in one line and before any collective, when num_experts is not a
    multiple of W, len(experts) is not E/W, or expert_ids is not T ids in 0..E-1.
    """
    raise NotImplementedError("l10_moe_dispatch")
