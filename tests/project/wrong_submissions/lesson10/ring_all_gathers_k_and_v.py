"""l10_ring_attention: 1 of 10. Every rank all_gathers the whole K and V and attends in one
go: the right numbers, but each rank then holds the whole sequence's keys and values, which
is what context parallelism is there to avoid; and it is a collective, not a ring."""


def ring_attention(q, k, v, group=None, causal=False):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    if not q.shape == k.shape == v.shape:
        raise ValueError("q, k and v differ in shape")
    size, me = dist.get_world_size(group), dist.get_rank(group)
    keys = [torch.empty_like(k) for _ in range(size)]
    values = [torch.empty_like(v) for _ in range(size)]
    dist.all_gather(keys, k.contiguous(), group=group)
    dist.all_gather(values, v.contiguous(), group=group)
    k_all, v_all = torch.cat(keys, dim=-2), torch.cat(values, dim=-2)
    block = q.shape[-2]
    mask = None
    if causal:
        rows = torch.arange(block) + me * block
        mask = rows[:, None] >= torch.arange(k_all.shape[-2])[None, :]
    return F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask)
