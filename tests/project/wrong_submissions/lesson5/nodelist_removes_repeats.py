"""l5_expand_nodelist: 7 of 8. Removes repeated hosts (keeping the first of each), which
`scontrol show hostnames` keeps: node[3,1,1] gives two hosts, not three."""

from itertools import product


def expand_nodelist(nodelist):
    if not nodelist.strip():
        raise ValueError("an empty node list")
    hosts = {}
    for item in _split_items(nodelist.strip()):
        item = item.strip()
        if not item:
            raise ValueError("an empty item")
        if "".join("[" + b + "]" if t == "" else t for b, t in ITEM_PART.findall(item)) != item:
            raise ValueError(f"cannot read {item!r}")
        choices = [_bracket_values(b) if t == "" else [t] for b, t in ITEM_PART.findall(item)]
        hosts.update(dict.fromkeys("".join(parts) for parts in product(*choices)))
    return list(hosts)
