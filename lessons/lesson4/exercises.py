"""Lesson 4 exercises: collectives from point-to-point messages, groups, and a hang to fix.

Replace each `raise NotImplementedError` with your code, then grade one exercise at a time:

    make grade LESSON=4                                   # all of lesson 4, with a score table
    .venv/bin/pytest tests/grading -m l4_ring_allreduce   # one exercise

Every function runs inside a process group that the caller has already initialised (the
grader starts torchrun jobs of 2, 3 and 4 processes, and a one-process world). In the first
three exercises build the collective yourself from point-to-point calls only: dist.send,
dist.recv, dist.isend, dist.irecv or dist.batch_isend_irecv. The grader makes the ready-made
collectives (dist.all_reduce, dist.all_gather, dist.broadcast, ..., however they are reached,
torch's functional collectives included) raise while your code runs, compares your results
with theirs afterwards, and weighs the messages you sent against the algorithm's cost.

To try your code yourself, write a small script that calls it and start it with
`torchrun --nproc-per-node=3 my_script.py`; see scripts/lesson4_collectives.py for the set-up.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta

import torch
import torch.distributed as dist


def ring_all_reduce(tensor: torch.Tensor) -> torch.Tensor:
    """Exercise l4_ring_allreduce: sum `tensor` over all ranks, in place, the ring way.

    Afterwards every rank's `tensor` holds the element-wise sum of all ranks' tensors, like
    dist.all_reduce(tensor) does; return `tensor`. It must work for any world size (odd ones
    too; with one rank there is nothing to do), any shape and any number of elements, even
    fewer elements than ranks, and for integer as well as float tensors. With fewer elements
    than ranks some chunks are empty: sending an empty chunk as a message or skipping it are
    both fine (graded: no more than the 2(W-1) steps' messages, none larger than one chunk).

    The plan: view the tensor as one flat row and cut it into W chunks (tensor_split gives
    chunk sizes that differ by at most one). Rank r sends to rank r+1 and receives from rank
    r-1 (mod W). Reduce-scatter: in step s = 0..W-2 rank r sends chunk r-s and adds the chunk
    r-s-1 it receives to its own; afterwards rank r holds the complete sum of chunk r+1.
    All-gather: in W-1 more steps each rank passes finished chunks on, overwriting its stale
    ones. If every rank calls a blocking send first, every rank waits for a receiver: post
    the send and the receive together (isend, or batch_isend_irecv). The grader watches the
    messages too, and most points are for them: each rank sends only to r+1 and receives
    only from r-1, one message each way per step, 2(W-1) steps, each message one chunk (so a
    rank sends 2(W-1)/W of the tensor in all, not whole tensors).
    """
    raise NotImplementedError("l4_ring_allreduce: write the reduce-scatter and all-gather steps")


def all_gather_p2p(tensor_list: list[torch.Tensor], tensor: torch.Tensor) -> None:
    """Exercise l4_all_gather: dist.all_gather(tensor_list, tensor), from send/recv.

    `tensor_list` holds one tensor per rank, each shaped like `tensor`; afterwards
    tensor_list[i] holds rank i's `tensor` on every rank (your own included). Raise
    ValueError when the list does not have exactly one tensor per rank.

    The grader also weighs the messages: every rank sends, and receives, W-1 tensors' worth
    in all, what an all-gather costs (a ring does that, and so does sending your tensor
    straight to every other rank); relaying everything through one rank costs it far more.
    """
    raise NotImplementedError("l4_all_gather: fill tensor_list with every rank's tensor")


def tree_broadcast(tensor: torch.Tensor, src: int) -> None:
    """Exercise l4_broadcast_tree: dist.broadcast(tensor, src), along a tree.

    Afterwards every rank's `tensor` holds what rank `src` had. Any rank may be the root,
    and any world size must work. Do not let the root send W-1 messages itself: in a
    binomial tree every rank that already has the data passes it on, so after round k
    2**k ranks have it, and no rank sends more than ceil(log2 W) messages or is more than
    ceil(log2 W) hops from the root (a binary tree works too; a chain does not). Raise
    ValueError when `src` is not a rank of the world.
    Hint: renumber the ranks so that the root is 0: me = (rank - src) % W.
    """
    raise NotImplementedError("l4_broadcast_tree: pass the tensor down a tree")


def node_group(environ: Mapping[str, str] | None = None,
               timeout: timedelta = timedelta(seconds=60)):
    """Exercise l4_node_groups (1 of 2): the process group of this process's node.

    Read WORLD_SIZE, LOCAL_WORLD_SIZE and GROUP_RANK (torchrun's node rank) from `environ`
    (os.environ when None), create one group per node with dist.new_group(ranks,
    timeout=timeout) and return the group of this process's node. torchrun starts the same
    number of processes on every node, so node n holds global ranks n*L .. n*L+L-1 where L
    is LOCAL_WORLD_SIZE. Remember: every process must create every group, in the same order,
    including the groups it is not part of.
    """
    raise NotImplementedError("l4_node_groups: create one group per node")


def node_leader_broadcast(tensor: torch.Tensor, group) -> None:
    """Exercise l4_node_groups (2 of 2): copy the node leader's tensor to its whole node.

    `group` is this process's node group (from node_group), or any other group the caller
    made. Afterwards every process of the group holds the tensor of the group's first
    process (the one with rank 0 in the group). Use dist.broadcast on the group; mind that
    its `src` is a global rank.
    """
    raise NotImplementedError("l4_node_groups: broadcast from the node's first process")


def report_loss(loss: torch.Tensor, rank: int) -> float | None:
    """Exercise l4_fix_hang: the mean of `loss` over all ranks, printed once by rank 0.

    Every rank of a training job calls report_loss(loss, rank) after each step. Rank 0
    returns the mean loss over all ranks (and prints it); the other ranks may return None.
    `loss` itself must stay unchanged: the caller still needs its own value.

    The code below is what was handed in. It works with one process, and with more it waits
    until the process group's timeout (or worse: it takes part in the next collective of the
    other ranks). Delete the raise, run it with torchrun --nproc-per-node=2 to see the
    problem, then fix it (scripts/lesson4_hang.py shows the same failure and how it ends).
    """
    raise NotImplementedError("l4_fix_hang: delete this line, then fix the code below")
    if rank == 0:
        total = loss.detach().clone()
        dist.all_reduce(total)
        mean = total.item() / dist.get_world_size()
        print(f"mean loss over {dist.get_world_size()} ranks: {mean:.4f}", flush=True)
        return mean
    return None
