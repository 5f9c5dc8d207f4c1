"""l6_atomic_snapshot: 13 of 15. Writes the new snapshot to a temporary file from
tempfile.mkstemp(), which lives in /tmp: where /tmp is another file system than the
snapshot's folder the rename is a copy (shutil.move) or fails (os.replace), not atomic."""

import tempfile


def save_snapshot(state, path):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(suffix=".pt")
    with os.fdopen(descriptor, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    if os.path.exists(path):
        os.replace(path, f"{path}.prev")
    os.replace(temporary, path)
