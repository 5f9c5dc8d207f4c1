"""l10_ring_attention: 9 of 10. Sends to (r + 1) % W and receives from (r - 1) % W as they
are, group ranks, where dist.isend and irecv take global ranks: right in the world, where
the two agree, wrong in any sub-group that does not start at global rank 0."""


def ring_attention(q, k, v, group=None, causal=False):
    import math

    import torch
    import torch.distributed as dist

    if not q.shape == k.shape == v.shape:
        raise ValueError("q, k and v differ in shape")
    size, me = dist.get_world_size(group), dist.get_rank(group)
    block = q.shape[-2]
    out = torch.zeros_like(q)
    m = torch.full((*q.shape[:-1], 1), -math.inf)
    s = torch.zeros_like(m)
    kv = torch.stack([k, v])
    for hop in range(size):
        owner = (me - hop) % size
        if hop < size - 1:
            incoming = torch.empty_like(kv)
            reqs = [dist.isend(kv, (me + 1) % size, group),
                    dist.irecv(incoming, (me - 1) % size, group)]
        if not causal or owner <= me:
            scores = q @ kv[0].transpose(-2, -1) / math.sqrt(q.shape[-1])
            if causal and owner == me:
                scores = scores.masked_fill(torch.ones(block, block).triu(1).bool(), -math.inf)
            new = torch.maximum(m, scores.amax(-1, keepdim=True))
            p = torch.exp(scores - new)
            s = s * torch.exp(m - new) + p.sum(-1, keepdim=True)
            out = out * torch.exp(m - new) + p @ kv[1]
            m = new
        if hop < size - 1:
            for r in reqs:
                r.wait()
            kv = incoming
    return out / s
