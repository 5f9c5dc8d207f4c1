"""l8_zero1_optimizer: 17 of 17. Right, another way: the shards all-gathered, padded.

Each rank packs its shard into a flat tensor padded to the fullest shard's length, and one
all_gather_into_tensor gives every rank every shard; each unpacks the others'. The padding
is the only extra, as in FSDP's flat parameters.
"""

import torch
import torch.distributed as dist


class Zero1Optimizer(Zero1Optimizer):
    def step(self):
        if self.optimizer is not None:
            self.optimizer.step()
        world = dist.get_world_size(self.group)
        shards = [[p for p, o in zip(self.params, self.owners, strict=True) if o == r]
                  for r in range(world)]
        length = max(sum(p.numel() for p in shard) for shard in shards)
        mine = shards[dist.get_rank(self.group)]
        padded = torch.zeros(length, dtype=self.params[0].dtype)
        if mine:
            packed = torch.cat([p.detach().flatten() for p in mine])
            padded[:packed.numel()] = packed
        everyone = torch.empty(world * length, dtype=padded.dtype)
        dist.all_gather_into_tensor(everyone, padded, group=self.group)
        with torch.no_grad():
            for shard, flat in zip(shards, everyone.split(length), strict=True):
                offset = 0
                for p in shard:
                    p.copy_(flat[offset:offset + p.numel()].view_as(p))
                    offset += p.numel()
