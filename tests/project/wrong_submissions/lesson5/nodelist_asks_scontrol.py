"""l5_expand_nodelist: 0 of 8. Asks SLURM's scontrol to expand the list (a program a laptop
does not have, and the answer the exercise asks you to write): the grader refuses it."""

import subprocess


def expand_nodelist(nodelist):
    shown = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                           text=True, check=True)
    return shown.stdout.split()
