"""l5_expand_nodelist: 7 of 8. Never checks that a range runs forwards: a[3-1] names no host at
all, silently, where the docstring asks for a ValueError."""

import re
from itertools import product


def expand_nodelist(nodelist):
    if not nodelist.strip():
        raise ValueError("an empty node list")
    hosts = []
    for item in _split_items(nodelist.strip()):
        item = item.strip()
        if not item:
            raise ValueError("an empty item")
        choices = []
        for bracket, text in ITEM_PART.findall(item):
            if text:
                choices.append([text])
                continue
            values = []
            for part in bracket.split(","):
                m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
                if not m:
                    raise ValueError(f"not a number: {part!r}")
                low, high = m.group(1), m.group(2) or m.group(1)
                values += [str(n).zfill(len(low)) for n in range(int(low), int(high) + 1)]
            choices.append(values)
        hosts += ["".join(parts) for parts in product(*choices)]
    return hosts
