"""l9_shard_loader: 2 of 9. The new loader is built with the sampler alone: one sample per
batch, and the last partial batch kept, whatever the loader did."""


def shard_loader(loader, rank, world_size, seed=0):
    from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, SequentialSampler

    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} of {world_size}")
    sampler = loader.sampler
    if isinstance(sampler, DistributedSampler):
        if (sampler.rank, sampler.num_replicas) != (rank, world_size):
            raise ValueError("sharded for another rank")
        return loader
    if loader.batch_size is None or type(sampler) not in (RandomSampler, SequentialSampler):
        raise ValueError(f"cannot shard {type(sampler).__name__}")
    return DataLoader(loader.dataset, collate_fn=loader.collate_fn,
                      num_workers=loader.num_workers,
                      sampler=DistributedSampler(loader.dataset, world_size, rank, seed=seed,
                                                 shuffle=isinstance(sampler, RandomSampler)))
