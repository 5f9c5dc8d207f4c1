"""l6_atomic_snapshot: 10 of 15. Writes atomically (a temporary file, then rename) but keeps
nothing of the snapshot it replaces: no .prev to fall back to when the newest is damaged."""


def save_snapshot(state, path):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    temporary = f"{path}.tmp"
    with open(temporary, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, path)
