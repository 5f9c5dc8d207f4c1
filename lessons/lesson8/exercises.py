"""Lesson 8 exercises: the memory a rank needs under each sharding strategy, ZeRO-1 built by
hand, and a two-stage pipeline built from send and recv.

Replace each `raise NotImplementedError` with your code, then grade one exercise at a time:

    make grade LESSON=8                                      # all of lesson 8, with a score table
    .venv/bin/pytest tests/grading -m l8_memory_calculator    # one exercise

l8_memory_calculator is graded in the grading process. l8_zero1_optimizer and
l8_pipeline_step are graded in torchrun jobs of 2 and 3 processes, in the world and in
sub-groups of it, where the grader also records every collective and message your code
starts, and its bytes: the right numbers reached the wrong way (every rank holding all the
optimizer state, a collective more than needed, the whole batch sent in one message) lose
most of the points.
"""

from __future__ import annotations

import torch
import torch.distributed as dist  # noqa: F401  (you will need it)
import torch.nn as nn
import torch.nn.functional as F

STRATEGIES = ("ddp", "zero1", "zero2", "zero3", "fsdp")
OPTIMIZERS = ("sgd", "sgd_momentum", "adam")


# --- l8_memory_calculator ------------------------------------------------------------------

def bytes_per_rank(num_params: int, world_size: int, strategy: str, optimizer: str = "adam",
                   mixed_precision: bool = False) -> dict[str, int]:
    """Exercise l8_memory_calculator: the bytes of model state one rank keeps.

    Return {"params": ..., "grads": ..., "optimizer": ..., "total": ...}, each an int number
    of bytes, total the sum of the other three: what each of `world_size` data-parallel ranks
    holds for a model of `num_params` parameters between steps, counted as the ZeRO paper
    counts it. Leave out activations, short-lived buffers (a layer FSDP gathers for a
    moment), and torch DDP's gradient buckets: with its default gradient_as_bucket_view=False
    DDP keeps them from step to step, a second copy of the gradients (the reading counts
    them), but the paper's count, and this exercise, do not.

    Bytes per parameter, before sharding:
    - mixed_precision=False: weights 4 (fp32), gradients 4, optimizer state 4 per buffer:
      optimizer "sgd" keeps no buffer, "sgd_momentum" one (the momentum), "adam" two (the
      first and second moments).
    - mixed_precision=True: weights 2 and gradients 2 (bf16 or fp16), and the optimizer term
      also holds the fp32 master copy of the weights: 4 + 4 per buffer, so Adam's is 12
      (the ZeRO paper's 2 + 2 + 12 = 16 bytes per parameter).

    What each strategy shards over the world_size ranks (a sharded term holds one rank's
    shard, an unsharded term the whole model):
    - "ddp": nothing; "zero1": the optimizer state; "zero2": the optimizer state and the
      gradients; "zero3": the optimizer state, the gradients and the weights; "fsdp": what
      FSDP's full sharding keeps, the same as "zero3".

    A shard of the model's N parameters over W ranks holds ceil(N / W) of them, the share
    of the fullest rank: FSDP's flat parameter and ZeRO's partitions pad the parameters to
    a multiple of W so that every rank holds that many, and FSDP2 gives each parameter's
    first dimension out in pieces of ceil(rows / W), rank 0's always full. So 10 parameters
    over 4 ranks: 3 per rank. (Treat the model as one flat tensor of N parameters.) There
    may be more ranks than parameters: 3 parameters over 8 ranks are 1 per rank, and one
    parameter on one rank is a valid model.

    Raise ValueError (one line) for num_params < 1, world_size < 1, or a strategy or
    optimizer not named above (names are exact: "Adam", "adam " or "zero-1" is refused).

    Graded: the ZeRO paper's own example (7.5 B parameters, 64 GPUs, mixed precision) to the
    byte; every term of every strategy for 7 B parameters on 8 GPUs; that from 1 to W ranks
    exactly the terms a strategy shards shrink W times; the rounding up at the edges above;
    and the refusals.
    """
    raise NotImplementedError("l8_memory_calculator: bytes of params, grads, optimizer state")


# --- l8_zero1_optimizer --------------------------------------------------------------------

class Zero1Optimizer:
    """Exercise l8_zero1_optimizer: ZeRO stage 1 by hand, sharding the optimizer state.

    Zero1Optimizer(model.parameters(), torch.optim.Adam, lr=1e-3) is used like the optimizer
    it wraps, after gradients that are already averaged over the ranks (a DDP model, or
    your lesson 3 average_gradients):

        loss.backward(); zero.step(); zero.zero_grad()

    and must end every step with the same parameters on every rank as
    optimizer_class(all parameters, **defaults) would give on one process.

    __init__(params, optimizer_class, group=None, **defaults):
    - `group` is the process group of the data-parallel ranks (None: the world). Ranks
      below are ranks in that group, which are not the global ranks: in the group of
      global ranks 1 and 2, global rank 1 is group rank 0. The grader runs it in the world
      and in such groups (global ranks 1 and 2 of 3; global rank 1 alone, of 2), where only
      the group's members call it.
    - Give each parameter, whole, to one rank, balancing the number of elements: go
      through the parameters largest first (by numel; equal sizes keep their order in
      `params`) and give each to the rank whose shard holds the fewest elements so far
      (the lowest such rank on a tie). This is what torch's ZeroRedundancyOptimizer does;
      a split whose fullest rank holds no more elements than this one's is as good.
    - Keep these attributes (the grader reads them):
        self.params     list of all the parameters, in the order given
        self.owners     list of ints: self.owners[i] is the rank that steps self.params[i]
        self.optimizer  the wrapped optimizer, optimizer_class(this rank's parameters,
                        **defaults): it steps, and keeps state for, this rank's shard only
                        (None on a rank that owns no parameter: torch's optimizers refuse
                        an empty list; graded with more ranks than parameters)
      Create no other optimizer: the point is that no rank holds the state of parameters
      it does not own. Every rank must agree on self.owners, and summed over the ranks the
      optimizers' state must be the model's full state, kept once. In a world of one, one
      rank owns everything and Zero1Optimizer is the optimizer it wraps. (Build it
      yourself: torch's ZeroRedundancyOptimizer, and the course's own partition in
      ddpcourse, refuse to work while this is graded.)

    step(): step this rank's shard with self.optimizer, then send every parameter from its
    owner to all the other ranks with a broadcast (or an all_gather; in a group, a
    collective's src= is a global rank: name the source by its group rank with group_src=,
    or translate it with dist.get_global_rank). Nothing else is communicated: the gradients
    were averaged before step was called. The grader counts the bytes each step() moves on
    each rank: exactly the parameters' bytes when broadcasting (each parameter once, alone
    or packed into one flat tensor per owner, in its own dtype); when all-gathering, at
    most the group's size times the fullest rank's shard (the shards padded to equal
    length). An extra collective (a barrier, an all_reduce, a second copy) loses points,
    and so does a send or recv. In a group of one nothing needs sending; a broadcast to
    itself is allowed. A rank that owns nothing still takes part in every broadcast.

    zero_grad(set_to_none=True): clear the gradients of all the parameters, not just the
    shard's (each rank's backward fills all of them): set them to None, or with
    set_to_none=False fill them with zeros in place.
    """

    def __init__(self, params, optimizer_class, group=None, **defaults):
        raise NotImplementedError("l8_zero1_optimizer: shard the parameters over the ranks")

    def step(self) -> None:
        raise NotImplementedError("l8_zero1_optimizer: step the shard, then share the result")

    def zero_grad(self, set_to_none: bool = True) -> None:
        raise NotImplementedError("l8_zero1_optimizer: clear every parameter's gradient")


# --- l8_pipeline_step ----------------------------------------------------------------------

def pipeline_step(stage: nn.Module, batch: torch.Tensor, num_micro_batches: int,
                  activation_shape: tuple[int, ...], loss_fn=F.cross_entropy,
                  group=None) -> torch.Tensor | None:
    """Exercise l8_pipeline_step: one training step's forward and backward through a model
    split over two processes, GPipe style.

    `group` (None: the world) holds two ranks: group rank 0 holds the first stage of the
    model, group rank 1 the second, each in its own process: `stage` is this process's
    half. (The grader uses the world of two, and the group of global ranks 1 and 2 of 3.)
    Both call pipeline_step with the same num_micro_batches M and activation_shape:
    - on group rank 0, `batch` is the whole batch of inputs;
    - on group rank 1, `batch` is the whole batch of targets, and the loss is
      loss_fn(output, targets), a mean over the samples.

    Check the arguments first, before running the stage or sending anything, and raise
    ValueError (one line) if the group does not hold exactly two ranks (a world of one, a
    group of one, a world of three: count the group's ranks, not the world's), if M < 1, or
    if the batch's length is not a multiple of M: the grader calls it with such arguments
    and a stage that must not run, on both stages, and checks that nothing was sent or
    received. Both stages make the same checks, so neither waits for the other.

    Split the batch into M equal micro-batches along dimension 0. activation_shape is the
    shape of the activation stage 0 sends for one micro-batch (its float32 output for
    batch_len / M samples), so stage 1 can receive it. Then, with dist.send / dist.recv (or
    isend / irecv) on `group`, ranks being group ranks (dist.get_global_rank(group, r), or
    the group_dst= / group_src= arguments):

    1. all forwards: stage 0 runs each micro-batch and sends its activation to stage 1,
       which receives it, runs it and computes that micro-batch's loss;
    2. then all backwards, last micro-batch first: stage 1 back-propagates its loss scaled
       by 1/M and sends the gradient of the activation it received back to stage 0, which
       receives it and back-propagates it through its own output for that micro-batch.

    Exactly one message per micro-batch each way, each the size of one micro-batch's
    float32 activation (in elements and in bytes): 2 x M messages in all. The gradients are
    accumulated into the stages' parameters' .grad (add to what is there, as backward does)
    and, summed over the micro-batches, equal those of the unsplit model on the whole batch.

    Return on stage 1 the loss of the whole batch (the mean of the micro-batch losses, a
    0-dimensional tensor without a graph); on stage 0 return None.
    """
    raise NotImplementedError("l8_pipeline_step: micro-batches forward, gradients backward")
