"""class 8, limits. Honest score: 0.

Takes what it can outside its processes' memory at import: fills /tmp past its size, leaves a
System V segment for the next sandbox, builds a folder chain too deep for Python's clean-up
in its home, and starts threads until none more start. Each is bounded by its sandbox and
gone with it; its classmates score what they would alone.
"""

import ctypes
import os
import threading

_MARK = os.path.join(os.environ.get("HOME", "/tmp"), ".filled")
if not os.path.exists(_MARK):  # once per sandbox, not once per rank
    open(_MARK, "w").close()
    try:
        with open("/tmp/filler", "wb") as _f:
            for _ in range(160):  # 640 MiB, in 4 MiB writes: more than /tmp holds
                _f.write(b"\1" * (4 << 20))
    except OSError:
        pass
    ctypes.CDLL(None).shmget(0x5EED, ctypes.c_size_t(1 << 20), 0o1000 | 0o666)
    try:
        _fd = os.open(os.environ.get("HOME", "/tmp"), os.O_RDONLY)
        for _ in range(1200):
            os.mkdir("x", dir_fd=_fd)
            _deeper = os.open("x", os.O_RDONLY, dir_fd=_fd)
            os.close(_fd)
            _fd = _deeper
        os.close(_fd)
    except OSError:
        pass
    _release = threading.Event()
    try:
        for _ in range(1200):  # more than its user may start
            threading.Thread(target=_release.wait, daemon=True).start()
    except RuntimeError:
        pass
    _release.set()
