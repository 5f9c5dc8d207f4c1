"""l8_zero1_optimizer: 17 of 17. Right, another way: one flat broadcast per owner.

Instead of a broadcast per parameter, each owner packs its updated shard into one flat
tensor and broadcasts it; the others unpack it into their copies. Fewer, larger messages:
what torch's ZeroRedundancyOptimizer does with its buckets. The source is named by its
global rank, translated from the owner's group rank (the world's group object stands in
for None, which get_global_rank does not take).
"""

import torch
import torch.distributed as dist


class Zero1Optimizer(Zero1Optimizer):
    def step(self):
        if self.optimizer is not None:
            self.optimizer.step()
        group = self.group or dist.group.WORLD
        with torch.no_grad():
            for owner in range(dist.get_world_size(group)):
                shard = [p for p, o in zip(self.params, self.owners, strict=True) if o == owner]
                if not shard:
                    continue
                flat = torch.cat([p.detach().flatten() for p in shard])
                dist.broadcast(flat, src=dist.get_global_rank(group, owner), group=group)
                for p, part in zip(shard, flat.split([p.numel() for p in shard]), strict=True):
                    p.copy_(part.view_as(p))
