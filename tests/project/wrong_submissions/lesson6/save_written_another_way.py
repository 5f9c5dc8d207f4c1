"""l6_atomic_snapshot: 15 of 15. Right, written another way: a NamedTemporaryFile in the
snapshot's own folder, fsynced through its descriptor, moved into place with shutil.move
(a rename within one folder); pathlib for the previous snapshot."""

import shutil
from pathlib import Path
from tempfile import NamedTemporaryFile


def save_snapshot(state, path):
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with NamedTemporaryFile(dir=target.parent, prefix=".saving-", delete=False) as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    if target.exists():
        target.replace(target.with_name(target.name + ".prev"))
    shutil.move(f.name, target)
