"""l10_moe_dispatch: 9 of 10. Checks its input only once the counts are exchanged (a wrong
number of experts shows up as counts that do not fit): the ValueError comes after a
collective, when every rank could have refused before any."""


def moe_dispatch(tokens, expert_ids, experts, num_experts, group=None):
    import torch
    import torch.distributed as dist
    import torch.distributed.nn.functional as dnn

    size = dist.get_world_size(group)
    counts = torch.bincount(expert_ids.clamp(0, num_experts), minlength=num_experts + 1)
    incoming = torch.empty_like(counts[:size * (len(counts) // size)])
    dist.all_to_all_single(incoming, counts[:len(incoming)], group=group)
    if num_experts % size or len(experts) != num_experts // size or counts[-1] or \
            len(counts) != num_experts + 1 or len(expert_ids) != len(tokens):
        raise ValueError("the counts do not fit the experts")
    local = num_experts // size
    counts, incoming = counts[:num_experts], incoming[:num_experts]
    order = torch.argsort(expert_ids, stable=True)
    send = counts.view(size, local).sum(1).tolist()
    table = incoming.view(size, local)
    receive = table.sum(1).tolist()
    rows = dnn.all_to_all_single(tokens.new_empty(sum(receive), tokens.shape[1]),
                                 tokens[order], receive, send, group=group)
    owner = torch.repeat_interleave(torch.arange(local).repeat(size), table.flatten())
    pieces = [(owner == e).nonzero().flatten() for e in range(local)]
    done = torch.cat([experts[e](rows[p]) for e, p in enumerate(pieces)])
    results = done[torch.argsort(torch.cat(pieces))]
    back = dnn.all_to_all_single(done.new_empty(len(tokens), done.shape[1]), results, send,
                                 receive, group=group)
    return back[torch.argsort(order)]
