"""l10_moe_dispatch: 10 of 10. Right, written another way: tokens ordered by destination rank
only, each row's local expert sent beside it, torch.distributed.nn.functional's
differentiable all_to_all_single, experts picked by mask, and every result put back in its
token's place with index_copy instead of an inverse permutation."""


def moe_dispatch(tokens, expert_ids, experts, num_experts, group=None):
    import torch
    import torch.distributed as dist
    import torch.distributed.nn.functional as dnn

    size = dist.get_world_size(group)
    if num_experts <= 0 or num_experts % size != 0:
        raise ValueError(f"{num_experts} experts over {size} ranks")
    per_rank = num_experts // size
    if len(experts) != per_rank:
        raise ValueError(f"expected {per_rank} experts here, got {len(experts)}")
    if expert_ids.shape != (tokens.shape[0],) or \
            bool(((expert_ids < 0) | (expert_ids >= num_experts)).any()):
        raise ValueError("expert_ids must hold one id in range per token")
    destination = expert_ids // per_rank
    order = torch.sort(destination, stable=True).indices
    sizes = torch.bincount(destination, minlength=size)
    their_sizes = torch.empty_like(sizes)
    dist.all_to_all_single(their_sizes, sizes, group=group)
    send, receive = sizes.tolist(), their_sizes.tolist()
    rows = dnn.all_to_all_single(tokens.new_empty(sum(receive), tokens.shape[1]),
                                 tokens[order], receive, send, group=group)
    local_ids = torch.empty(sum(receive), dtype=torch.long)
    dist.all_to_all_single(local_ids, (expert_ids[order] % per_rank).contiguous(), receive, send,
                           group=group)
    done = None
    for e in range(per_rank):
        where = (local_ids == e).nonzero().flatten()
        y = experts[e](rows[where])
        done = y.new_zeros(len(rows), y.shape[1]) if done is None else done
        done = done.index_copy(0, where, y)
    back = dnn.all_to_all_single(done.new_empty(len(tokens), done.shape[1]), done, send,
                                 receive, group=group)
    return back.new_zeros(back.shape).index_copy(0, order, back)
