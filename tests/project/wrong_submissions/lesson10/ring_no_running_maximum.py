"""l10_ring_attention: 9 of 10. The online softmax without its running maximum: the sums of
exp(score) are merged as they come, which is exact until a score passes about 88, where
float32's exp overflows to inf and the output becomes nan."""


def ring_attention(q, k, v, group=None, causal=False):
    import torch
    import torch.distributed as dist

    if not q.shape == k.shape == v.shape:
        raise ValueError("q, k and v differ in shape")
    size, me = dist.get_world_size(group), dist.get_rank(group)
    nxt = dist.get_global_rank(group, (me + 1) % size) if group else (me + 1) % size
    prv = dist.get_global_rank(group, (me - 1) % size) if group else (me - 1) % size
    block = q.shape[-2]
    numerator = torch.zeros_like(q)
    denominator = torch.zeros(*q.shape[:-1], 1)
    kv = torch.stack([k, v])
    for hop in range(size):
        owner = (me - hop) % size
        if hop < size - 1:
            incoming = torch.empty_like(kv)
            reqs = [dist.isend(kv, nxt, group), dist.irecv(incoming, prv, group)]
        if not causal or owner <= me:
            weights = torch.exp(q @ kv[0].transpose(-2, -1) / q.shape[-1] ** 0.5)
            if causal and owner == me:
                weights = weights * torch.ones(block, block).tril()
            numerator = numerator + weights @ kv[1]
            denominator = denominator + weights.sum(-1, keepdim=True)
        if hop < size - 1:
            for r in reqs:
                r.wait()
            kv = incoming
    return numerator / denominator
