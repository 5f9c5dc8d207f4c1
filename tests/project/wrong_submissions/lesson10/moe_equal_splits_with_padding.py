"""l10_moe_dispatch: 7 of 10. Equal splits, padded: every rank learns the largest count any
rank sends anywhere (an all_reduce), pads each destination's rows to it and swaps equal
chunks. Right and differentiable, but most of what it sends is padding, it needs an
all_reduce besides the all-to-all, and a rank without tokens fails picking its padding."""


def moe_dispatch(tokens, expert_ids, experts, num_experts, group=None):
    import torch
    import torch.distributed as dist
    import torch.distributed.nn.functional as dnn

    size = dist.get_world_size(group)
    local = num_experts // size
    if num_experts % size or len(experts) != local:
        raise ValueError("experts do not divide over the ranks")
    if expert_ids.dim() != 1 or len(expert_ids) != len(tokens):
        raise ValueError("one expert id per token")
    if len(expert_ids) and not 0 <= int(expert_ids.min()) <= int(expert_ids.max()) < num_experts:
        raise ValueError("an expert id is out of range")
    capacity = torch.bincount(expert_ids // local, minlength=size).max().reshape(1)
    dist.all_reduce(capacity, op=dist.ReduceOp.MAX, group=group)
    c = int(capacity)
    slots = torch.full((size * c,), -1, dtype=torch.long)  # which token fills each slot
    for dest in range(size):
        mine = (expert_ids // local == dest).nonzero().flatten()
        slots[dest * c:dest * c + len(mine)] = mine
    filled = slots >= 0
    padded = torch.zeros(size * c, tokens.shape[1]) + tokens[slots.clamp(min=0)] * filled[:, None]
    ids = torch.where(filled, expert_ids[slots.clamp(min=0)] % local, -1)
    got = dnn.all_to_all_single(torch.empty_like(padded), padded, group=group)
    got_ids = torch.empty_like(ids)
    dist.all_to_all_single(got_ids, ids, group=group)
    outs = []
    for i in range(len(got)):
        e = int(got_ids[i])
        outs.append(experts[e](got[i]) if e >= 0 else experts[0](got[i]) * 0)
    results = torch.stack(outs)
    back = dnn.all_to_all_single(torch.empty_like(results), results, group=group)
    answer = torch.zeros(len(tokens), back.shape[1])
    return answer.index_add(0, slots[filled], back[filled])
