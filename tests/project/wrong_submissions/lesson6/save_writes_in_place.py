"""l6_atomic_snapshot: 7 of 15. Keeps the previous snapshot, then writes the new one straight
to its name: a crash half-way leaves a truncated file where the snapshot should be."""


def save_snapshot(state, path):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    if os.path.exists(path):
        os.replace(path, f"{path}.prev")
    torch.save(state, path)
