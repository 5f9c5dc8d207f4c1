"""class 5, leftovers. Honest score: 0.

Starts processes that outlive the call that started them: one in a session of its own, one
double-forked away from its parent, both meant to rewrite results later.
"""

import os
import subprocess
import sys

_CODE = "import time  # course-cheat-daemon\ntime.sleep(600)"
try:
    subprocess.Popen([sys.executable, "-c", _CODE], start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL)
except OSError:
    pass
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-c", _CODE])
    os._exit(0)
