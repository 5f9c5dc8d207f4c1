"""l7_bucketed_allreduce: 8 of 14. Each bucket's all-reduce starts in its hook, and the
hook waits on its future there: the right gradients and buckets, but backward stands still
while every bucket travels, so nothing overlaps (a wait on the future blocks like Work.wait)."""

import torch
import torch.distributed as dist


class BucketedAllReduce:
    def __init__(self, model, bucket_cap_bytes, group=None):
        self.group = group
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.buckets = bucket_assignment([p.numel() * p.element_size() for p in self.params],
                                         bucket_cap_bytes)
        self.bucket_of = {i: b for b, bucket in enumerate(self.buckets) for i in bucket}
        self.waiting = [len(bucket) for bucket in self.buckets]
        for index, param in enumerate(self.params):
            param.register_post_accumulate_grad_hook(
                lambda param, index=index: self.arrived(index))

    def arrived(self, index):
        b = self.bucket_of[index]
        self.waiting[b] -= 1
        if self.waiting[b] == 0:
            flat = torch.cat([self.params[i].grad.flatten() for i in self.buckets[b]])
            dist.all_reduce(flat, group=self.group, async_op=True).get_future().wait()
            flat /= dist.get_world_size(self.group)
            offset = 0
            for i in self.buckets[b]:
                grad = self.params[i].grad
                grad.copy_(flat[offset:offset + grad.numel()].view_as(grad))
                offset += grad.numel()

    def finish(self):
        self.waiting = [len(bucket) for bucket in self.buckets]
