"""l9_exact_validation: 3 of 11. Each rank counts each of its samples once, then the counts
are summed: a sample two ranks evaluated (DistributedSampler's padding) still counts twice."""


def exact_accuracy(indices, correct, length, group=None):
    import torch
    import torch.distributed as dist

    if len(indices) != len(correct) or any(not 0 <= i < length for i in indices):
        raise ValueError("indices and results do not match the set")
    once = dict(zip((int(i) for i in indices), (bool(c) for c in correct), strict=True))
    counts = torch.tensor([float(sum(once.values())), float(len(once))], dtype=torch.float64)
    dist.all_reduce(counts, group=group)
    if counts[1] < length:
        raise ValueError(f"only {int(counts[1])} of {length} samples evaluated")
    return (counts[0] / counts[1]).item()
