"""l5_expand_nodelist: 3 of 8. Varies the first bracket fastest: rack[1-2]-n[1-2] gives rack1-n1,
rack2-n1, rack1-n2, rack2-n2, not SLURM's order (the last bracket fastest), so the hosts and
the job's first host come out in the wrong order."""

from itertools import product


def expand_nodelist(nodelist):
    if not nodelist.strip():
        raise ValueError("an empty node list")
    hosts = []
    for item in _split_items(nodelist.strip()):
        item = item.strip()
        if not item:
            raise ValueError(f"an empty item in {nodelist!r}")
        if "".join("[" + b + "]" if t == "" else t for b, t in ITEM_PART.findall(item)) != item:
            raise ValueError(f"cannot read {item!r}")
        choices = [_bracket_values(b) if t == "" else [t] for b, t in ITEM_PART.findall(item)]
        hosts += ["".join(reversed(parts)) for parts in product(*reversed(choices))]
    return hosts
