"""l3_ddp_step: 2 of 8. DDP and a DistributedSampler, but no set_epoch: every epoch reads
epoch 0's shares again. The gradients are still averaged every step (2 points)."""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler


def train_ddp(model, dataset, global_batch, epochs, lr, seed=0):
    sampler = DistributedSampler(dataset, shuffle=True, seed=seed)
    loader = DataLoader(dataset, batch_size=global_batch // dist.get_world_size(),
                        sampler=sampler)
    ddp_model = DDP(model)
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=lr, momentum=0.9)
    steps = len(dataset) // global_batch
    for _ in range(epochs):
        for _, (images, labels) in zip(range(steps), loader, strict=False):
            loss = F.cross_entropy(ddp_model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return model
