"""Scripts teach by their diffs: every `diff scripts/A.py scripts/B.py` the course promises (in a
script, a reading or a notebook) is small enough to read as one lesson's change, and the step
scripts use torch's documented API only.
"""

import re
import subprocess

import pytest
from util import ROOT, promised_diffs

MAX_CHANGED_LINES = 100
# A private name reached through a dot (`reducer._get_zeros_like_grad_buckets`,
# `torch.distributed._tools`): an experiment may need one, a step script should not.
PRIVATE = re.compile(r"\.(_[a-z]\w*)")


PROMISED = promised_diffs()


def changed_lines(old, new):
    out = subprocess.run(["diff", old, new], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode in (0, 1), out.stderr
    return [line for line in out.stdout.splitlines() if line.startswith(("<", ">"))]


def test_the_course_promises_its_diffs():
    steps = {new for _, new in PROMISED}
    # Lessons 2-8 each teach at least one step of the training by its diff; lesson 4 calls
    # the collectives on their own, outside that progression.
    progression = set(range(2, 9)) - {4}
    assert {int(re.match(r"scripts/lesson(\d+)_", new).group(1)) for new in steps} >= (
        progression), sorted(steps)


@pytest.mark.parametrize("pair", sorted(PROMISED), ids=lambda p: f"{p[0]}->{p[1]}")
def test_a_promised_diff_is_one_lesson_s_change(pair):
    old, new = pair
    where = PROMISED[pair]
    assert (ROOT / old).is_file() and (ROOT / new).is_file(), f"{where} promise a missing file"
    changed = changed_lines(old, new)
    assert len(changed) <= MAX_CHANGED_LINES, (
        f"`diff {old} {new}` (promised in {', '.join(sorted(set(where)))}) changes "
        f"{len(changed)} lines; a step is its predecessor plus one idea, at most "
        f"{MAX_CHANGED_LINES}")


@pytest.mark.parametrize("step", sorted({new for _, new in PROMISED}))
def test_a_step_script_uses_no_private_torch_api(step):
    names = [(n, line.strip()) for n, line in enumerate((ROOT / step).read_text().splitlines(), 1)
             if not line.lstrip().startswith("#") for name in PRIVATE.findall(line)
             if not name.startswith("__")]
    assert not names, f"{step} reaches private names (an experiment's job): {names}"


@pytest.mark.parametrize("lesson", range(5, 9))
def test_reading_shows_its_lesson_s_key_diff(lesson):
    reading = (ROOT / "lessons" / f"lesson{lesson}" / "README.md").read_text()
    assert "```diff\n" in reading, f"lesson {lesson}'s reading shows no diff block"
