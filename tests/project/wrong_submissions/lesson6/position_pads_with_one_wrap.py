"""l6_resume_position: 10 of 12. Pads by repeating the order once (order + order[:padding]):
right while the padding is shorter than the dataset, but with more ranks than samples (1
sample on 3 ranks) the padded order is too short and some ranks get nothing to train."""


def resume_indices(num_samples, seed, epoch, start, rank, world_size):
    generator = torch.Generator()
    generator.manual_seed(seed + epoch)
    order = torch.randperm(num_samples, generator=generator).tolist()
    total = -(-num_samples // world_size) * world_size
    order += order[: total - len(order)]
    return order[start:][rank::world_size]
