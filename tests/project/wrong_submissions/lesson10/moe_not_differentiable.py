"""l10_moe_dispatch: 4 of 10. The right trip with dist.all_to_all_single, which autograd does
not go through: the forward is exact and moves the right rows, but no gradient comes back to
the tokens, and the experts learn nothing from the other ranks' tokens."""


def moe_dispatch(tokens, expert_ids, experts, num_experts, group=None):
    import torch
    import torch.distributed as dist

    size = dist.get_world_size(group)
    if num_experts % size or len(experts) != num_experts // size:
        raise ValueError("experts do not divide over the ranks")
    if expert_ids.dim() != 1 or len(expert_ids) != len(tokens):
        raise ValueError("one expert id per token")
    if len(expert_ids) and not 0 <= int(expert_ids.min()) <= int(expert_ids.max()) < num_experts:
        raise ValueError("an expert id is out of range")
    local = num_experts // size
    order = torch.argsort(expert_ids, stable=True)
    counts = torch.bincount(expert_ids, minlength=num_experts)
    incoming = torch.empty_like(counts)
    dist.all_to_all_single(incoming, counts, group=group)
    send = counts.view(size, local).sum(1).tolist()
    table = incoming.view(size, local)
    receive = table.sum(1).tolist()
    rows = tokens.new_empty(sum(receive), tokens.shape[1])
    dist.all_to_all_single(rows, tokens[order].detach().contiguous(), receive, send, group=group)
    owner = torch.repeat_interleave(torch.arange(local).repeat(size), table.flatten())
    results = None
    for e in range(local):
        picked = (owner == e).nonzero().flatten()
        y = experts[e](rows[picked])
        if results is None:
            results = rows.new_zeros(len(rows), y.shape[1])
        results[picked] = y.detach()
    back = tokens.new_empty(len(tokens), results.shape[1])
    dist.all_to_all_single(back, results.contiguous(), send, receive, group=group)
    out = torch.empty_like(back)
    out[order] = back
    return out
