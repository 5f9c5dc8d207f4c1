"""l10_moe_dispatch: 1 of 10. The trip is right, but the results come back in the order the
tokens were sorted by expert, and are returned so: row t is some other token's result
whenever the tokens were not already in expert order."""


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
    order = torch.argsort(expert_ids, stable=True)
    counts = torch.bincount(expert_ids, minlength=num_experts)
    incoming = torch.empty_like(counts)
    dist.all_to_all_single(incoming, counts, group=group)
    send = counts.view(size, local).sum(1).tolist()
    table = incoming.view(size, local)
    receive = table.sum(1).tolist()
    rows = dnn.all_to_all_single(tokens.new_empty(sum(receive), tokens.shape[1]),
                                 tokens[order], receive, send, group=group)
    owner = torch.repeat_interleave(torch.arange(local).repeat(size), table.flatten())
    pieces = [(owner == e).nonzero().flatten() for e in range(local)]
    done = torch.cat([experts[e](rows[p]) for e, p in enumerate(pieces)])
    results = done[torch.argsort(torch.cat(pieces))]
    return dnn.all_to_all_single(done.new_empty(len(tokens), done.shape[1]), results, send,
                                 receive, group=group)
