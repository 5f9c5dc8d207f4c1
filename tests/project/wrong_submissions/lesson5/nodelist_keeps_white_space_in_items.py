"""l5_expand_nodelist: 7 of 8. Strips white space from the ends of the list only, not around
each item: "a,b , c" names the hosts "b " and " c", which no resolver finds."""

from itertools import product


def expand_nodelist(nodelist):
    text = nodelist.strip()
    if not text:
        raise ValueError("an empty node list")
    hosts = []
    for item in _split_items(text):
        if not item.strip():
            raise ValueError("an empty item")
        if "".join("[" + b + "]" if t == "" else t for b, t in ITEM_PART.findall(item)) != item:
            raise ValueError(f"cannot read {item!r}")
        choices = [_bracket_values(b) if t == "" else [t] for b, t in ITEM_PART.findall(item)]
        hosts += ["".join(parts) for parts in product(*choices)]
    return hosts
