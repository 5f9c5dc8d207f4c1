"""l9_exact_validation: 11 of 11. Right, written another way: every rank's (index, result)
pairs gathered as objects, then a dict keeps each sample once."""


def exact_accuracy(indices, correct, length, group=None):
    import torch.distributed as dist

    if len(indices) != len(correct):
        raise ValueError(f"{len(indices)} indices, {len(correct)} results")
    pairs = [(int(i), bool(c)) for i, c in zip(indices, correct, strict=True)]
    if any(not 0 <= i < length for i, _ in pairs):
        raise ValueError(f"an index outside 0..{length - 1}")
    everyone = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, pairs, group=group)
    result = {i: c for share in everyone for i, c in share}
    if len(result) != length:
        raise ValueError(f"{length - len(result)} samples evaluated by no rank")
    return sum(result.values()) / length
