"""l4_node_groups: 7 of 7. Right another way: group_src names the leader by its rank in the
group, which dist.broadcast translates itself."""

import torch.distributed as dist


def node_leader_broadcast(tensor, group):
    dist.broadcast(tensor, group_src=0, group=group)
