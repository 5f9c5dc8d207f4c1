"""l9_exact_validation: 9 of 11. Exact, but over the world whatever group it is given: inside a
sub-group it mixes in every other group's samples."""


def exact_accuracy(indices, correct, length, group=None):
    import torch
    import torch.distributed as dist

    if len(indices) != len(correct) or any(not 0 <= i < length for i in indices):
        raise ValueError("indices and results do not match the set")
    seen = torch.zeros(2, length, dtype=torch.float64)
    for i, c in zip(indices, correct, strict=True):
        seen[0, i] += 1
        seen[1, i] += float(c)
    dist.all_reduce(seen)
    if (seen[0] == 0).any():
        raise ValueError("a sample no rank evaluated")
    return float((seen[1] / seen[0]).sum() / length)
