"""l9_shard_loader: 9 of 9. Right, written another way: the loader's settings copied by name,
the sampler swapped, and the refusals written as one table."""


def shard_loader(loader, rank, world_size, seed=0):
    from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, SequentialSampler

    sampler = loader.sampler
    refusals = [
        (not 0 <= rank < world_size, f"rank {rank} is not in a world of {world_size}"),
        (isinstance(sampler, DistributedSampler) and
         (sampler.num_replicas, sampler.rank) != (world_size, rank),
         "the loader is sharded for another rank or world size"),
        (loader.batch_size is None, "the loader has a batch sampler of its own"),
        (type(sampler) not in (RandomSampler, SequentialSampler, DistributedSampler),
         f"a {type(sampler).__name__} cannot be split"),
    ]
    for refused, why in refusals:
        if refused:
            raise ValueError(why)
    if isinstance(sampler, DistributedSampler):
        return loader
    settings = {name: getattr(loader, name) for name in
                ("batch_size", "drop_last", "collate_fn", "num_workers", "pin_memory",
                 "timeout", "worker_init_fn")}
    mine = DistributedSampler(range(len(loader.dataset)), num_replicas=world_size, rank=rank,
                              shuffle=type(sampler) is RandomSampler, seed=seed)
    return DataLoader(loader.dataset, sampler=mine, **settings)
