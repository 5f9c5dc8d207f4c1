"""l9_exact_validation: 0 of 11. Right answers and samples summed over the ranks: exact when W
divides the set, but the samples DistributedSampler repeats are counted twice, and a sample
no rank saw goes unnoticed. (The checks before the two refusals need the right value too.)"""


def exact_accuracy(indices, correct, length, group=None):
    import torch
    import torch.distributed as dist

    if len(indices) != len(correct) or any(not 0 <= i < length for i in indices):
        raise ValueError("indices and results do not match the set")
    counts = torch.tensor([float(correct.sum()), float(len(indices))], dtype=torch.float64)
    dist.all_reduce(counts, group=group)
    return (counts[0] / counts[1]).item()
