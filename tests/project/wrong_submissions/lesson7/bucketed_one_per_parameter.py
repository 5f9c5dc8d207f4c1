"""l7_bucketed_allreduce: 10 of 14. Each hook starts an all-reduce of its own parameter's
gradient at once: it overlaps backward, but sends many small messages instead of a few
buckets (DDP's first design, before buckets)."""

import torch.distributed as dist


class BucketedAllReduce:
    def __init__(self, model, bucket_cap_bytes, group=None):
        self.group = group
        self.launched = []
        for param in model.parameters():
            if param.requires_grad:
                param.register_post_accumulate_grad_hook(self.hook)

    def hook(self, param):
        self.launched.append((param, dist.all_reduce(param.grad, group=self.group,
                                                     async_op=True)))

    def finish(self):
        world = dist.get_world_size(self.group)
        for param, handle in self.launched:
            handle.wait()
            param.grad /= world
        self.launched = []
