"""l6_resume_position: 12 of 12. Right, written another way: never builds the padded order;
position p of it is order[p % num_samples], and the rank's positions are a range."""


def resume_indices(num_samples, seed, epoch, start, rank, world_size):
    generator = torch.Generator().manual_seed(seed + epoch)
    order = torch.randperm(num_samples, generator=generator).tolist()
    padded_length = -(-num_samples // world_size) * world_size
    return [order[p % num_samples] for p in range(start + rank, padded_length, world_size)]
