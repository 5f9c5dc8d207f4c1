"""l4_node_groups: 2 of 7. The node leader's broadcast names the leader by its rank in the
group (0) where dist.broadcast wants a global rank: right on one node, where the two are
the same, wrong on every other node."""

import torch.distributed as dist


def node_leader_broadcast(tensor, group):
    dist.broadcast(tensor, src=0, group=group)
