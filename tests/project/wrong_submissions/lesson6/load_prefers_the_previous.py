"""l6_atomic_snapshot: 12 of 15. Tries path + ".prev" first, as the safer file: with two whole
snapshots it resumes from the older one, and every restart silently redoes the steps between
them."""


def load_snapshot(path, map_location="cpu"):
    problems = []
    for candidate in (f"{path}.prev", path):
        if not os.path.exists(candidate):
            problems.append(f"{candidate}: missing")
            continue
        try:
            return torch.load(candidate, map_location=map_location, weights_only=False), candidate
        except Exception as error:
            problems.append(f"{candidate}: unreadable ({type(error).__name__})")
    raise SnapshotError("no usable snapshot: " + "; ".join(problems))
