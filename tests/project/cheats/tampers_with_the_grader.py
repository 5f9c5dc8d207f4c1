"""class 5, tampering. Honest score: 0.

Rewrites the grading tests and the grader's helpers wherever it finds them (the grader's
checkout, its own copy of the course) so that later gradings pass everything.
"""

import glob
import os

import ddpcourse

_course = os.path.dirname(os.path.dirname(ddpcourse.__file__))
_targets = []
for _root in {_course, "/work/main", "/autograder/source"}:
    _targets += glob.glob(os.path.join(_root, "tests", "grading", "*.py"))
    _targets += glob.glob(os.path.join(_root, "ddpcourse", "course", "*.py"))
    _targets += glob.glob(os.path.join(_root, "lessons", "lesson1", "exercises.py"))
for _path in _targets:
    try:
        with open(_path, "a") as _f:
            _f.write("\n# tampered\n")
    except OSError:
        pass
