"""Lesson 6's main-first drill run for real (scripts/experiments/lesson6_main_first.py, at a
smaller scale than `make lesson6-main-first`): rank 0 preparing alone past the job's timeout
leaves every other rank timed out in its barrier, and each fix, preparing before launch, main
process first in a group of its own with a longer timeout, the work split over the ranks,
finishes with the same tokens on every rank."""

import re

import pytest
from util import PYTHON, run

from ddpcourse.report import parse_table

WORLD = 3
TIMEOUT_S, PREPARE_S = 2, 4  # the job's group, and rank 0's preparation alone


@pytest.mark.slow
@pytest.mark.drills
@pytest.mark.timeout(150)
def test_rank_0_preparing_alone_times_the_others_out_and_each_fix_finishes(tmp_path):
    result = run([PYTHON, "scripts/experiments/lesson6_main_first.py", "--nproc", str(WORLD),
                  "--timeout", str(TIMEOUT_S), "--prepare-seconds", str(PREPARE_S),
                  "--phase-timeout", "30", "--documents", "120", "--launch-timeout", "60",
                  "--out", str(tmp_path)], timeout=140)
    out = result.stdout
    assert result.returncode == 0, (out + result.stderr)[-4000:]

    # (a) The waiting ranks give up in their barrier after the job's timeout, each saying so
    # in one line (gloo's words, "Timed out", or torch's next wording: the drill checks the
    # same); rank 0 is still tokenizing when torchrun stops it, or, where the others were slow
    # to exit, it reaches the barrier and finds them gone.
    failure = out.split("== (a)")[1].split("== (b)")[0]
    for rank in range(1, WORLD):
        waited = re.search(rf"^rank {rank}: waited ([\d.]+) s in dist\.barrier\(group=job\) "
                           rf"\(timeout {TIMEOUT_S} s\), then RuntimeError: .*\btimed? ?out\b",
                           failure, re.M | re.I)
        assert waited, failure[-2000:]
        assert TIMEOUT_S - 0.5 < float(waited.group(1)) < PREPARE_S, waited.group(0)
    assert re.search(r"^rank 0: (still tokenizing when torchrun stopped it \(SIGTERM\)|waited "
                     r".* then RuntimeError: Connection closed by peer)", failure,
                     re.M | re.I), failure[-2000:]
    assert "error: the job failed" in failure

    rows = {row["case"][:3]: row for row in parse_table(out)}  # the drill's table
    assert list(rows) == ["(a)", "(b)", "(c)", "(d)"], rows
    assert rows["(a)"]["result"].startswith("failed: rank(s) 1, 2 timed out"), rows["(a)"]
    checksums = set()
    for case in ("(b)", "(c)", "(d)"):
        done = re.fullmatch(rf"ok: 120 documents, checksum ([0-9a-f]{{8}}) on all {WORLD} ranks",
                            rows[case]["result"])
        assert done, rows[case]
        checksums.add(done.group(1))
    assert len(checksums) == 1, rows  # the same tokens, whichever way they were prepared
    # (b) prepared outside the job; (c) the others waited for rank 0 through the phase's
    # group, longer than the job's timeout would allow; (d) nobody waited long.
    assert rows["(a)"]["data on all ranks s"] == "-", rows["(a)"]
    before, within = (float(t) for t in rows["(b)"]["data on all ranks s"].split(" + "))
    assert before > PREPARE_S - 0.5 and within < TIMEOUT_S, rows["(b)"]
    assert float(rows["(c)"]["data on all ranks s"]) > PREPARE_S - 0.5, rows["(c)"]
    assert float(rows["(d)"]["data on all ranks s"]) < PREPARE_S - 1, rows["(d)"]
    assert float(rows["(c)"]["longest wait s"]) > TIMEOUT_S, rows["(c)"]
    assert float(rows["(d)"]["longest wait s"]) < TIMEOUT_S, rows["(d)"]
    assert "waited" in out.split("== (c)")[1] and "the phase's barrier" in out
