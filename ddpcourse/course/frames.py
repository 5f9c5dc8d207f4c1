"""The grader's one wire format, used on every channel between its processes.

A frame is an 8-byte little-endian length, then a `torch.save`d value. Whatever comes from a
process that runs a submission's code (a sandbox's replies, a relayed rank's requests) is
read with `torch.load(weights_only=True)`, so only data crosses (numbers, strings, lists,
dicts, plain tensors) and never an object with code of its own; a frame the grader's own
processes wrote to each other (the judge's requests, a sandbox to start) is read as written
(`trusted=True`). Every reader gives a limit, checked before the body is read.
"""

from __future__ import annotations

import io
import struct

HEADER = struct.Struct("<Q")
LIMIT = 256 * 2**20  # bytes in one frame


class FrameTooLarge(ValueError):
    pass


def encode(value) -> bytes:
    """The frame of `value`: its length, then its bytes."""
    import torch

    buffer = io.BytesIO()
    torch.save(value, buffer)
    body = buffer.getvalue()
    return HEADER.pack(len(body)) + body


def body_size(header: bytes, limit: int = LIMIT) -> int:
    (size,) = HEADER.unpack(header)
    if size > limit:
        raise FrameTooLarge(f"a frame of {size} bytes, more than {limit}")
    return size


def decode(body: bytes, trusted: bool = False):
    import torch

    return torch.load(io.BytesIO(body), weights_only=not trusted)


def read_frame(read_exactly, limit: int = LIMIT, trusted: bool = False):
    """One frame from `read_exactly(n)`, a function that returns exactly n bytes or raises."""
    return decode(read_exactly(body_size(read_exactly(HEADER.size), limit)), trusted)
