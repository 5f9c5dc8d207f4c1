"""l5_expand_nodelist: 8 of 8. A right answer written another way: a small recursive expander."""

import re


def expand_nodelist(nodelist):
    text = nodelist.strip()
    if not text:
        raise ValueError("an empty node list")
    items, depth, start = [], 0, 0
    for i, char in enumerate(text + ","):
        depth += (char == "[") - (char == "]")
        if depth not in (0, 1):
            raise ValueError("unbalanced or nested brackets")
        if char == "," and depth == 0:
            items.append(text[start:i].strip())
            start = i + 1
    if depth:
        raise ValueError("unbalanced brackets")
    return [host for item in items for host in _expand(item)]


def _expand(item):
    if not item:
        raise ValueError("an empty item")
    m = re.match(r"([^\[\]]*)\[([^\[\]]*)\](.*)$", item)
    if not m:
        if "[" in item or "]" in item:
            raise ValueError(item)
        return [item]
    head, inside, rest = m.groups()
    if not inside:
        raise ValueError("an empty bracket")
    values = []
    for part in inside.split(","):
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (_ and not hi.isdigit()) or (hi and int(hi) < int(lo)):
            raise ValueError(part)
        values += [str(n).zfill(len(lo)) for n in range(int(lo), int(hi or lo) + 1)]
    return [head + v + tail for v in values for tail in _expand_tail(rest)]


def _expand_tail(rest):
    return _expand(rest) if rest else [""]
