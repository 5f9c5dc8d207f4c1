"""l5_process_devices: 2 of 7. The process ends in my_devices (os._exit, as a crash, an abort or
an out-of-memory kill would end it): the checks that call it are lost, the two that call
process_devices directly keep their points in a fresh sandbox, and every other exercise keeps
its own."""

import os


def my_devices(*args, **kwargs):
    os._exit(3)
