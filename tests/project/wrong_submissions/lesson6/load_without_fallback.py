"""l6_atomic_snapshot: 12 of 15. Loads the newest snapshot or nothing: a damaged file ends the
run with torch's own error, though the one before it is whole."""


def load_snapshot(path, map_location="cpu"):
    return torch.load(path, map_location=map_location, weights_only=False), path
