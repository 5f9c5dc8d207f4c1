"""l5_expand_nodelist: 1 of 8. Splits the list at every comma, also those inside brackets, so
node[01-03,07] falls apart; one range per item at most."""

import re


def expand_nodelist(nodelist):
    if not nodelist.strip():
        raise ValueError("an empty node list")
    hosts = []
    for item in nodelist.split(","):
        item = item.strip()
        if not item:
            raise ValueError("an empty item")
        m = re.fullmatch(r"(.*?)\[(\d+)(?:-(\d+))?\](.*)", item)
        if m:
            prefix, low, high, suffix = m.groups()
            hosts += [f"{prefix}{str(n).zfill(len(low))}{suffix}"
                      for n in range(int(low), int(high or low) + 1)]
        elif "[" in item or "]" in item:
            raise ValueError(f"cannot read {item!r}")
        else:
            hosts.append(item)
    return hosts
