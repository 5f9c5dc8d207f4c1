"""l10_ring_attention: 2 of 10. No ring: every rank sends its K and V block straight to every
other rank and merges the blocks as they come, with the running maximum. The outputs are
right, but each rank sends W - 1 messages to W - 1 peers and holds every block it receives:
the all-gather the ring exists to avoid, written with messages."""


def ring_attention(q, k, v, group=None, causal=False):
    import math

    import torch
    import torch.distributed as dist

    if not q.shape == k.shape == v.shape:
        raise ValueError(f"q, k and v differ in shape: {tuple(q.shape)}, {tuple(k.shape)}")
    size, me = dist.get_world_size(group), dist.get_rank(group)

    def global_rank(r):
        return dist.get_global_rank(group, r) if group else r

    mine = torch.stack([k, v])
    blocks = {me: mine}
    requests = []
    for other in range(size):
        if other != me:
            blocks[other] = torch.empty_like(mine)
            requests.append(dist.isend(mine, global_rank(other), group))
            requests.append(dist.irecv(blocks[other], global_rank(other), group))
    for request in requests:
        request.wait()
    block, scale = q.shape[-2], q.shape[-1] ** -0.5
    below_diagonal = torch.ones(block, block, dtype=torch.bool).tril()
    total = torch.zeros_like(q)
    peak = torch.full((*q.shape[:-1], 1), -math.inf, dtype=q.dtype)
    mass = torch.zeros_like(peak)
    for owner in range(size):
        if causal and owner > me:
            continue
        scores = (q @ blocks[owner][0].transpose(-2, -1)) * scale
        if causal and owner == me:
            scores = scores.masked_fill(~below_diagonal, -math.inf)
        new_peak = torch.maximum(peak, scores.amax(dim=-1, keepdim=True))
        weights = torch.exp(scores - new_peak)
        shrink = torch.exp(peak - new_peak)
        mass = mass * shrink + weights.sum(dim=-1, keepdim=True)
        total = total * shrink + weights @ blocks[owner][1]
        peak = new_peak
    return total / mass
