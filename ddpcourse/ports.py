"""Free TCP ports on this machine: the standard library only, so the launcher (before .venv
exists) and a script's world of one (ddpcourse.runtime) both take them from here."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port that nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
