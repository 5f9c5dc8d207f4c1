"""l3_ddp_step: 8 of 8. Right another way: the loop enumerates the loader and breaks after
the last step, so the loader has already fetched one batch it does not use (allowed)."""

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
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for step, (images, labels) in enumerate(loader):
            if step == steps:
                break
            loss = F.cross_entropy(ddp_model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return model
