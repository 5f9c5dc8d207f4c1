"""l9_exact_validation: 10 of 11. Exact, but the answer is a one-element tensor, not the Python
float asked for (a logger or a JSON file would choke on it): the one point that checks it."""


def exact_accuracy(indices, correct, length, group=None):
    import torch
    import torch.distributed as dist

    if len(indices) != len(correct) or any(not 0 <= i < length for i in indices):
        raise ValueError("indices and results do not match the set")
    seen = torch.zeros(2, length, dtype=torch.float64)
    for i, c in zip(indices, correct, strict=True):
        seen[0, i] += 1
        seen[1, i] += float(c)
    dist.all_reduce(seen, group=group)
    if (seen[0] == 0).any():
        raise ValueError("a sample no rank evaluated")
    return (seen[1] / seen[0]).sum() / length
