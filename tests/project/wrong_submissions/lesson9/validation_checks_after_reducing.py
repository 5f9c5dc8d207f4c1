"""l9_exact_validation: 10 of 11. Exact, but the input is checked only after the all-reduce:
a rank with bad input has already made the others reduce with it."""


def exact_accuracy(indices, correct, length, group=None):
    import torch
    import torch.distributed as dist

    seen = torch.zeros(2, length, dtype=torch.float64)
    for i, c in zip(indices, correct, strict=False):
        if 0 <= i < length:
            seen[0, i] += 1
            seen[1, i] += float(c)
    dist.all_reduce(seen, group=group)
    if len(indices) != len(correct) or any(not 0 <= i < length for i in indices):
        raise ValueError("indices and results do not match the set")
    if (seen[0] == 0).any():
        raise ValueError("a sample no rank evaluated")
    return float((seen[1] / seen[0]).sum() / length)
