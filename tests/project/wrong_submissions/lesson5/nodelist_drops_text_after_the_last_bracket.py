"""l5_expand_nodelist: 4 of 8. Reads an item as pieces of `text[numbers]` and drops whatever
follows its last bracket: gpu[1-2]-ib gives gpu1 and gpu2, the wrong network's names."""

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
        pieces = re.findall(r"([^\[\]]*)\[([^\[\]]*)\]", item)
        if not pieces:
            if "[" in item or "]" in item:
                raise ValueError(f"cannot read {item!r}")
            hosts.append(item)
            continue
        choices = [[text] for text, _ in pieces]
        numbers = [_bracket_values(inside) for _, inside in pieces]
        choices = [c for pair in zip(choices, numbers, strict=True) for c in pair]
        hosts += ["".join(parts) for parts in product(*choices)]
    return hosts
