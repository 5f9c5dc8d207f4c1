"""l9_shard_loader: 7 of 9. Any loader is sharded afresh: one sharded for another rank, a
weighted sampler, a batch sampler of its own, all silently replaced by DistributedSampler."""


def shard_loader(loader, rank, world_size, seed=0):
    from torch.utils.data import DataLoader, DistributedSampler, RandomSampler

    sampler = loader.sampler
    if isinstance(sampler, DistributedSampler) and \
            (sampler.rank, sampler.num_replicas) == (rank, world_size):
        return loader
    shuffle = isinstance(sampler, RandomSampler) or getattr(sampler, "shuffle", False)
    return DataLoader(loader.dataset, batch_size=loader.batch_size or 1,
                      drop_last=loader.drop_last, collate_fn=loader.collate_fn,
                      num_workers=loader.num_workers,
                      sampler=DistributedSampler(loader.dataset, world_size, max(rank, 0),
                                                 shuffle=shuffle, seed=seed))
