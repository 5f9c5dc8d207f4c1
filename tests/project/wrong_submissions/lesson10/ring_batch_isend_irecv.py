"""l10_ring_attention: 10 of 10. Right, written another way: K and V as two messages each hop,
posted together with batch_isend_irecv (group_peer: no global ranks to work out), and the
merge kept as a running log-sum-exp instead of a maximum and a sum."""


def ring_attention(q, k, v, group=None, causal=False):
    import math

    import torch
    import torch.distributed as dist

    if q.shape != k.shape or k.shape != v.shape:
        raise ValueError(f"shapes differ: {tuple(q.shape)} {tuple(k.shape)} {tuple(v.shape)}")
    world = dist.get_world_size(group)
    me = dist.get_rank(group)
    n = q.shape[-2]
    out, lse = None, None
    key, value = k.contiguous(), v.contiguous()
    for step in range(world):
        source = (me - step) % world
        if step + 1 < world:
            next_key, next_value = torch.empty_like(key), torch.empty_like(value)
            ops = [dist.P2POp(dist.isend, key, group=group, group_peer=(me + 1) % world),
                   dist.P2POp(dist.isend, value, group=group, group_peer=(me + 1) % world),
                   dist.P2POp(dist.irecv, next_key, group=group, group_peer=(me - 1) % world),
                   dist.P2POp(dist.irecv, next_value, group=group, group_peer=(me - 1) % world)]
            pending = dist.batch_isend_irecv(ops)
        if source <= me or not causal:
            logits = torch.matmul(q, key.transpose(-1, -2)) / math.sqrt(q.shape[-1])
            if causal and source == me:
                future = torch.triu(torch.ones(n, n, dtype=torch.bool), diagonal=1)
                logits = logits.masked_fill(future, float("-inf"))
            block_lse = torch.logsumexp(logits, dim=-1, keepdim=True)
            block_out = torch.matmul(torch.exp(logits - block_lse), value)
            if out is None:
                out, lse = block_out, block_lse
            else:
                new_lse = torch.logaddexp(lse, block_lse)
                out = out * torch.exp(lse - new_lse) + block_out * torch.exp(block_lse - new_lse)
                lse = new_lse
        if step + 1 < world:
            for work in pending:
                work.wait()
            key, value = next_key, next_value
    return out
