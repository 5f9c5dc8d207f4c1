"""l6_atomic_snapshot: 13 of 15. Writes beside the snapshot and renames, but fsyncs only after
the rename: until then the new name may point at bytes still in memory, and a power cut
leaves an empty or partial snapshot under it."""


def save_snapshot(state, path):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    temporary = f"{path}.tmp"
    torch.save(state, temporary)
    if os.path.exists(path):
        os.replace(path, f"{path}.prev")
    os.replace(temporary, path)
    with open(path, "rb") as f:
        os.fsync(f.fileno())
