"""l10_moe_dispatch: 4 of 10. No all-to-all: every rank writes its tokens into its rows of one
buffer of every token, an all-reduce (autograd's) gives every rank all of them, each rank runs
its experts on theirs and a second all-reduce brings every output everywhere. Right and
differentiable, but every token and every output travels to every rank: the experts' work is
shared out, the traffic is not."""


def moe_dispatch(tokens, expert_ids, experts, num_experts, group=None):
    import torch
    import torch.distributed as dist
    import torch.distributed.nn.functional as dnn

    size, me = dist.get_world_size(group), dist.get_rank(group)
    local = num_experts // size
    if num_experts % size or len(experts) != local:
        raise ValueError("experts do not divide over the ranks")
    if expert_ids.dim() != 1 or len(expert_ids) != len(tokens):
        raise ValueError("one expert id per token")
    if len(expert_ids) and not 0 <= int(expert_ids.min()) <= int(expert_ids.max()) < num_experts:
        raise ValueError("an expert id is out of range")
    counts = [torch.zeros(1, dtype=torch.int64) for _ in range(size)]
    dist.all_gather(counts, torch.tensor([len(tokens)]), group=group)
    counts = [int(c) for c in counts]
    start = sum(counts[:me])
    total = sum(counts)
    every_token = torch.zeros(total, tokens.shape[1], dtype=tokens.dtype)
    every_token = every_token.index_copy(0, torch.arange(start, start + len(tokens)), tokens)
    every_id = torch.zeros(total, dtype=torch.int64)
    every_id[start:start + len(tokens)] = expert_ids
    every_token = dnn.all_reduce(every_token, group=group)
    dist.all_reduce(every_id, group=group)
    d_out = experts[0](tokens[:0] if len(tokens) else every_token[:0]).shape[1]
    outputs = torch.zeros(total, d_out, dtype=tokens.dtype)
    for e in range(local):
        rows = (every_id == me * local + e).nonzero().flatten()
        if len(rows):
            outputs = outputs.index_copy(0, rows, experts[e](every_token[rows]))
    outputs = dnn.all_reduce(outputs, group=group)
    return outputs[start:start + len(tokens)]
