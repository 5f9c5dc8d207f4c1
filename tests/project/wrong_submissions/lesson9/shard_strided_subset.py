"""l9_shard_loader: 0 of 9. Every W-th sample of the dataset, by a Subset, read with the
loader's own kind of sampler: the shares differ in length where W does not divide the set
(DDP's ranks then wait for each other at the end), the order is not DistributedSampler's,
and there is no set_epoch."""


def shard_loader(loader, rank, world_size, seed=0):
    from torch.utils.data import DataLoader, RandomSampler, Subset

    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} of {world_size}")
    share = Subset(loader.dataset, range(rank, len(loader.dataset), world_size))
    return DataLoader(share, batch_size=loader.batch_size, drop_last=loader.drop_last,
                      shuffle=isinstance(loader.sampler, RandomSampler),
                      collate_fn=loader.collate_fn, num_workers=loader.num_workers)
