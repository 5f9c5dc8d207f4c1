"""l6_atomic_snapshot: 1 of 15. Moves the old snapshot aside with os.replace before checking
that there is one: the first save of a run, with no snapshot yet, raises FileNotFoundError."""


def save_snapshot(state, path):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    temporary = f"{path}.tmp"
    with open(temporary, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path, f"{path}.prev")
    os.replace(temporary, path)
