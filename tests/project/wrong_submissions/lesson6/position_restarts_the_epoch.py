"""l6_resume_position: 4 of 12. Ignores `start`: a resumed job trains the whole epoch again,
so the samples before the failure are seen twice in that epoch."""


def resume_indices(num_samples, seed, epoch, start, rank, world_size):
    generator = torch.Generator()
    generator.manual_seed(seed + epoch)
    order = torch.randperm(num_samples, generator=generator).tolist()
    total = -(-num_samples // world_size) * world_size
    order += (order * (total // max(1, len(order)) + 1))[: total - len(order)]
    return order[rank::world_size]
