"""l3_ddp_step: 2 of 8. Nothing is distributed: every rank runs the one-device loop on the
whole dataset. The result equals one-process training (the 2 points for the result), but
every rank reads every sample and no gradient is ever all-reduced."""

import torch
import torch.nn.functional as F


def train_ddp(model, dataset, global_batch, epochs, lr, seed=0):
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    model.train()
    for epoch in range(epochs):
        g = torch.Generator().manual_seed(seed + epoch)
        order = torch.randperm(len(dataset), generator=g).tolist()
        for step in range(len(dataset) // global_batch):
            images, labels = dataset[order[step * global_batch:(step + 1) * global_batch]]
            loss = F.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return model
