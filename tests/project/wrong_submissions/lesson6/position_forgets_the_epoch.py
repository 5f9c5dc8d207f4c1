"""l6_resume_position: 0 of 12. Seeds the order with `seed` alone: every epoch has the same
shuffle (what forgetting sampler.set_epoch does), unlike DistributedSampler's."""


def resume_indices(num_samples, seed, epoch, start, rank, world_size):
    generator = torch.Generator()
    generator.manual_seed(seed)
    order = torch.randperm(num_samples, generator=generator).tolist()
    total = -(-num_samples // world_size) * world_size
    order += (order * (total // max(1, len(order)) + 1))[: total - len(order)]
    return order[start:][rank::world_size]
