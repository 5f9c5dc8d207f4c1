"""l5_expand_nodelist: 3 of 8. Pads every number of a range to its wider bound: gpu[8-10] gives
gpu08, gpu09, gpu10, names SLURM never meant (it writes n8, n9, n10 as n[8-10])."""

import re
from itertools import product


def expand_nodelist(nodelist):
    if not nodelist.strip():
        raise ValueError("an empty node list")
    if re.search(r"\[[^\]]*\[|\][^\[]*\]", nodelist) or nodelist.count("[") != nodelist.count("]"):
        raise ValueError("unbalanced or nested brackets")
    hosts = []
    for item in re.split(r",(?![^\[]*\])", nodelist):
        item = item.strip()
        if not item:
            raise ValueError("an empty item")
        pieces = re.split(r"\[([^\]]*)\]", item)
        choices = [[text] if i % 2 == 0 else _numbers(text) for i, text in enumerate(pieces)]
        hosts += ["".join(parts) for parts in product(*choices)]
    return hosts


def _numbers(inside):
    numbers = []
    for part in inside.split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise ValueError(f"not a number or a range: {part!r}")
        low, high = m.group(1), m.group(2) or m.group(1)
        if int(high) < int(low):
            raise ValueError(f"{part!r} runs backwards")
        width = max(len(low), len(high))
        numbers += [str(n).zfill(width) for n in range(int(low), int(high) + 1)]
    return numbers
