"""What the grading workers watch: the messages and collectives a rank starts.

However student code reaches a collective or a message (dist.all_reduce, a ProcessGroup
method, a function imported before the grader looked, torch's functional collectives in
torch.distributed._functional_collectives or torch.ops._c10d_functional, batch_isend_irecv,
DDP's gradient hooks), it ends up calling one of torch's dispatcher operators in the c10d
namespaces: c10d::allreduce_, c10d::send, _c10d_functional::all_reduce, ... So that is
where the workers look:

Traffic() records every such operator this thread calls (a message's peer and bytes; a
collective's elements, bytes and the ranks of the group it ran on). A relayed job (lessons 4
and 10) needs none of this: the relay sees and refuses every collective from outside the
rank (ddpcourse/course/relay.py).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode  # sees every operator a thread runs

NAMESPACES = ("c10d", "_c10d_functional", "c10d_functional", "_c10d_functional_autograd")
MESSAGES = {"c10d::send": "send", "c10d::recv_": "recv", "c10d::recv_any_source_": "recv"}
# Not collectives: they move no data.
HARMLESS = {"c10d::barrier", "c10d::monitored_barrier_", "c10d::check_for_nan",
            "_c10d_functional::wait_tensor", "c10d_functional::wait_tensor",
            "_c10d_functional::_wrap_tensor_autograd"}


class Message(NamedTuple):
    kind: str          # "send" or "recv"
    peer: int | None   # rank in the group (the world group in the workers); None: any source
    numel: int
    nbytes: int


class Collective(NamedTuple):
    op: str            # e.g. "c10d::allreduce_"
    numel: int         # elements of the tensors it was given
    nbytes: int = 0    # their bytes: a float64 tensor is twice a float32 one of equal numel
    ranks: tuple[int, ...] | None = None  # global ranks of its group; None: not known


def group_ranks(func, args, kwargs) -> tuple[int, ...] | None:
    """The global ranks of the process group a c10d operator was called on: a ProcessGroup
    argument (the c10d ops) or a group's name (torch's functional collectives)."""
    given = {spec.name: value for spec, value in zip(func._schema.arguments, args,
                                                     strict=False)} | (kwargs or {})
    for name in ("process_group", "group_name"):
        if name not in given:
            continue
        value = given[name]
        try:
            if isinstance(value, str):
                # Private, but the one way from a functional collective's group name back
                # to its group.
                group = dist.distributed_c10d._resolve_process_group(value)
            else:
                group = dist.ProcessGroup.unbox(value)
            return tuple(dist.get_process_group_ranks(group))
        except Exception:  # a group the registry does not know (or a destroyed one)
            return None
    return None


def tensors_in(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from tensors_in(item)


class Traffic(TorchDispatchMode):
    """Inside `with Traffic() as seen:`, seen.messages and seen.collectives fill up.

    A dispatch mode sees every operator the thread calls, so it also sees the collectives
    DDP starts from its hooks during backward (on the CPU they run in the calling thread).
    """

    def __init__(self):
        super().__init__()
        self.messages: list[Message] = []
        self.collectives: list[Collective] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace in NAMESPACES:
            name = func._schema.name  # an operator's full name: only its schema has it
            tensors = list(tensors_in(args[0] if args else ()))
            numel = sum(t.numel() for t in tensors)
            if name in MESSAGES:
                peer = args[2] if name != "c10d::recv_any_source_" else None
                self.messages.append(Message(MESSAGES[name], peer, numel,
                                             sum(t.numel() * t.element_size() for t in tensors)))
            elif name not in HARMLESS:
                self.collectives.append(Collective(
                    name, numel, sum(t.numel() * t.element_size() for t in tensors),
                    group_ranks(func, args, kwargs)))
        return func(*args, **(kwargs or {}))

    def sent(self) -> list[Message]:
        return [m for m in self.messages if m.kind == "send"]

    def received(self) -> list[Message]:
        return [m for m in self.messages if m.kind == "recv"]


