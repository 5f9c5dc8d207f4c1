"""l9_shard_loader: 0 of 9. The loader's own batches dealt out, every W-th to this rank (as
Accelerate's prepare() does): another order than DistributedSampler's, a loader already
sharded is sharded again, and it refuses nothing it should."""


def shard_loader(loader, rank, world_size, seed=0):
    from torch.utils.data import DataLoader, Sampler

    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} of {world_size}")

    class EveryWthBatch(Sampler):
        def __init__(self, batches):
            self.batches = batches

        def __iter__(self):
            return (b for i, b in enumerate(self.batches) if i % world_size == rank)

        def __len__(self):
            return len(range(rank, len(self.batches), world_size))

        def set_epoch(self, epoch):
            if hasattr(self.batches.sampler, "set_epoch"):
                self.batches.sampler.set_epoch(epoch)

    return DataLoader(loader.dataset, batch_sampler=EveryWthBatch(loader.batch_sampler),
                      collate_fn=loader.collate_fn, num_workers=loader.num_workers)
