"""l7_bucketed_allreduce: 14 of 14. A right answer written another way: each bucket's
all-reduce gets a callback on its future (as DDP's communication hooks do) that averages
and copies back, and finish() waits for the futures. Accepted."""

import torch
import torch.distributed as dist


class BucketedAllReduce:
    def __init__(self, model, bucket_cap_bytes, group=None):
        self.group = group
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.buckets = bucket_assignment([p.numel() * p.element_size() for p in self.params],
                                         bucket_cap_bytes)
        self.ready = [set() for _ in self.buckets]
        self.futures = []
        owner = {i: b for b, bucket in enumerate(self.buckets) for i in bucket}
        for index, param in enumerate(self.params):
            param.register_post_accumulate_grad_hook(
                lambda param, index=index: self.arrived(owner[index], index))

    def arrived(self, b, index):
        self.ready[b].add(index)
        if len(self.ready[b]) < len(self.buckets[b]):
            return
        grads = [self.params[i].grad for i in self.buckets[b]]
        flat = torch._utils._flatten_dense_tensors(grads)
        world = dist.get_world_size(self.group)

        def copy_back(future):
            mean = future.value()[0] / world
            for grad, part in zip(grads, torch._utils._unflatten_dense_tensors(mean, grads),
                                  strict=True):
                grad.copy_(part)

        work = dist.all_reduce(flat, group=self.group, async_op=True)
        self.futures.append(work.get_future().then(copy_back))

    def finish(self):
        torch.futures.wait_all(self.futures)
        self.futures = []
        self.ready = [set() for _ in self.buckets]
