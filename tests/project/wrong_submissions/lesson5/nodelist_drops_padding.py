"""l5_expand_nodelist: 3 of 8. Ranges lose their zero padding: node[01-03] gives node1, node2,
node3, names no cluster has."""

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
        for bracket, text in re.findall(r"\[([^\[\]]*)\]|([^\[\]]+)", item):
            if text:
                choices.append([text])
                continue
            values = []
            for part in bracket.split(",") if bracket else [""]:
                low, dash, high = part.partition("-")
                if not low.isdigit() or (dash and not high.isdigit()):
                    raise ValueError(part)
                if dash and int(high) < int(low):
                    raise ValueError(part)
                values += [str(n) for n in range(int(low), int(high or low) + 1)]
            choices.append(values)
        hosts += ["".join(parts) for parts in product(*choices)]
    return hosts
