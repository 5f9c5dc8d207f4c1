"""l6_resume_position: 10 of 12. Gets DistributedSampler's order by seeding torch's global
generator and drawing from it: the positions are right, but every call resets the generator
the training's dropout draws from, so each epoch repeats the same dropout masks."""


def resume_indices(num_samples, seed, epoch, start, rank, world_size):
    torch.manual_seed(seed + epoch)
    order = torch.randperm(num_samples).tolist()
    total = -(-num_samples // world_size) * world_size
    order += (order * (total // max(1, len(order)) + 1))[: total - len(order)]
    return order[start:][rank::world_size]
