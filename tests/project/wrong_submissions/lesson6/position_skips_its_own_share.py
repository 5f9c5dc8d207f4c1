"""l6_resume_position: 6 of 12. Skips start // world_size of the rank's own split: right while
the world size stays the same, but after an elastic job shrinks or grows the ranks skip the
wrong positions, and some samples are trained twice while others never."""


def resume_indices(num_samples, seed, epoch, start, rank, world_size):
    generator = torch.Generator()
    generator.manual_seed(seed + epoch)
    order = torch.randperm(num_samples, generator=generator).tolist()
    total = -(-num_samples // world_size) * world_size
    order += (order * (total // max(1, len(order)) + 1))[: total - len(order)]
    return order[rank::world_size][start // world_size:]
