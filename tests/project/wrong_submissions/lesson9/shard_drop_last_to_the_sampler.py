"""l9_shard_loader: 6 of 9. The loader's drop_last handed to the DistributedSampler too: where
the world does not divide the length, the sampler drops the tail instead of padding, so a
rank's share is one sample shorter and, with the loader's drop_last, may lose a whole batch
(23 samples over 3 ranks in batches of 4: 7 each, one batch, where padding gives 8, two).
Right whenever the world divides the length, or the loader keeps its last batch."""


def shard_loader(loader, rank, world_size, seed=0):
    from torch.utils.data import DataLoader, DistributedSampler, RandomSampler

    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not one of a world of {world_size}")
    sampler = loader.sampler
    if isinstance(sampler, DistributedSampler):
        if (sampler.num_replicas, sampler.rank) != (world_size, rank):
            raise ValueError("already sharded for another rank")
        return loader
    if loader.batch_size is None or type(sampler).__name__ not in (
            "RandomSampler", "SequentialSampler") or getattr(sampler, "replacement", False):
        raise ValueError(f"cannot shard a loader whose sampler is {type(sampler).__name__}")
    return DataLoader(loader.dataset, batch_size=loader.batch_size, drop_last=loader.drop_last,
                      collate_fn=loader.collate_fn, num_workers=loader.num_workers,
                      sampler=DistributedSampler(loader.dataset, num_replicas=world_size,
                                                 rank=rank,
                                                 shuffle=isinstance(sampler, RandomSampler),
                                                 seed=seed, drop_last=loader.drop_last))
