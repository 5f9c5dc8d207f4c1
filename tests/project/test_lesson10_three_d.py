"""Lesson 10's 3-D run, on gloo at W = 8, the smallest world with every dimension of 2 or more:
a pipeline of two stages (pp), each an FSDP2 (dp) x tensor-parallel (tp) grid, trains equal to
one process; each dimension carries exactly the predicted collectives, count and bytes; every
rank holds exactly the predicted bytes of parameters, gradients and Adam's state; a world
that does not factor is refused in one line.

Eight ranks are more than the suite's usual 1-4: started from the test suite's fork server
the job takes 4-8 s on 2 shared cores (measured; about 0.8 s per step, 8 processes on 2 cores),
cheap enough to show all three dimensions at once rather than a W = 4 mesh with one of them 1.
The job is launched once (a module-scoped fixture) and checked several ways. The numbers below
are worked out by hand from the script's default shapes, apart from the script's arithmetic:
4 blocks, 2 per stage, each LayerNorm(16), qkv Linear(16, 48) without bias, out Linear(16, 16),
LayerNorm(16), up Linear(16, 64), down Linear(64, 16); the final LayerNorm(16) on stage 1;
global batch 16 x 8 tokens, 2 dp rows of 8 samples, 2 micro-batches of 4.
"""

import pytest
from util import ROOT, summary

from ddpcourse.cluster.launch import launch
from ddpcourse.report import parse_table

# Lesson 10's runs of 3 to 8 processes run in `make test-lesson10` (CI too): with them
# `make test` would pass its five minutes.
pytestmark = pytest.mark.lesson10

SCRIPT = "scripts/experiments/lesson10_three_d.py"
WORLD = 8
TOLERANCE = 1e-5
F32 = 4

ACTIVATION = 4 * 8 * 16 * F32  # a micro-batch: 4 samples x 8 tokens x 16 features
# one block's parameters on one tp rank (qkv and up keep half their rows, out and down half
# their columns; biases of the row-split out and down whole); dp = 2 halves it all again
NORMS = 2 * (16 + 16)
TP_BLOCK = NORMS + 24 * 16 + (16 * 8 + 16) + (32 * 16 + 32) + (16 * 32 + 16)  # 1664 numbers
ROOT_NORM = 16 + 16  # the final LayerNorm, on the last stage
TENSORS_PER_BLOCK = 11  # norm1 2, qkv 1, out 2, norm2 2, up 2, down 2: Adam's step counters


@pytest.fixture(scope="module")
def three_d_job():
    result = launch(SCRIPT, [], nproc=WORLD, timeout=150, capture=True, echo=False,
                    backend="gloo", cwd=str(ROOT))
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return result.stdout


def table_after(text: str, heading: str) -> list[dict[str, str]]:
    return parse_table(text[text.index(heading):])


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_three_d_training_equals_one_process(three_d_job):
    facts = summary(three_d_job)
    assert facts["world_size"] == "8" and facts["mesh"] == "2x2x2", facts
    assert facts["same_as_one_process"] == "True", three_d_job
    assert float(facts["max_diff"]) < TOLERANCE, facts
    lines = three_d_job.splitlines()
    ours = next(line for line in lines if line.startswith("pipeline x fsdp x tp: losses"))
    one = next(line for line in lines if line.startswith("one process:"))
    assert ours.split("losses")[1].split() == one.split("losses")[1].split(), (ours, one)


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_each_dimension_carries_the_predicted_collectives(three_d_job):
    rows = table_after(three_d_job, "collectives of a training step")
    found = {}
    for row in rows:
        assert row["predicted"] == row["measured"], row
        assert row["predicted bytes"] == row["measured bytes"], row
        assert row["check"] == "same", row
        found[int(row["stage"]), int(row["step"]), row["dimension"], row["collective"]] = (
            int(row["measured"]), int(row["measured bytes"]))
    expected, dp_sent = {}, 0
    for stage in (0, 1):
        root = ROOT_NORM if stage == 1 else 0
        units = 2 * TP_BLOCK  # this stage's two blocks, whole over the dp pair
        gathered, scattered = (3 * units + root) * F32, (units + root) * F32
        expected |= {
            # the last step: two micro-batches each way, one neighbour
            (stage, 3, "pp", "send"): (2, 2 * ACTIVATION),
            (stage, 3, "pp", "recv"): (2, 2 * ACTIVATION),
            # step 1 adds the schedule's vote: one int32 each way
            (stage, 1, "pp", "send"): (3, 2 * ACTIVATION + 4),
            (stage, 1, "pp", "recv"): (3, 2 * ACTIVATION + 4),
            # per block and micro-batch: 2 forward (out, down), 2 backward (qkv's, up's input)
            (stage, 3, "tp", "all_reduce"): (2 * 2 * 4, 2 * 2 * 4 * ACTIVATION),
            # blocks gathered for each of the 2 micro-batches' forwards and once for backward;
            # the root (stage 1's final norm) once; gradients reduce-scattered once per unit.
            # Bytes of the whole tensor: the gather's output, the scatter's input.
            (stage, 3, "dp", "all_gather"): (2 * 3 + (stage == 1), gathered),
            (stage, 3, "dp", "reduce_scatter"): (2 + (stage == 1), scattered),
        }
        dp_sent += 4 * (gathered + scattered) // 2  # 4 ranks, each sending (g-1)/g of it
    assert found == expected, (found, expected)
    facts = summary(three_d_job)
    assert facts["collectives_as_predicted"] == "True", facts
    # all ranks, a steady step: each of the 8 sends 2 micro-batches' activations or gradients
    # over pp; a tp all_reduce's ring sends 2(g-1)/g = 1 x its tensor per rank
    assert int(facts["pp_sent_per_step"]) == 8 * 2 * ACTIVATION
    assert int(facts["tp_sent_per_step"]) == 8 * 16 * ACTIVATION
    assert int(facts["dp_sent_per_step"]) == dp_sent


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_every_rank_holds_the_predicted_memory(three_d_job):
    rows = table_after(three_d_job, "parameters, gradients and adam's state")
    assert [int(row["rank"]) for row in rows] == list(range(WORLD)), three_d_job
    for row in rows:
        stage = int(row["rank"]) // 4  # rank = pp x 4 + dp x 2 + tp
        numbers = (2 * TP_BLOCK + (ROOT_NORM if stage == 1 else 0)) // 2  # sharded over dp
        tensors = 2 * TENSORS_PER_BLOCK + (2 if stage == 1 else 0)
        assert int(row["params B"]) == int(row["grads B"]) == numbers * F32, row
        assert int(row["optimizer B"]) == 2 * numbers * F32 + 4 * tensors, row  # + steps
        assert row["total B"] == row["predicted B"] and row["check"] == "same", row
    assert summary(three_d_job)["memory_as_predicted"] == "True"


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_world_that_does_not_factor_is_refused_in_one_line():
    result = launch(SCRIPT, [], nproc=2, timeout=90, capture=True, echo=False,
                    backend="gloo", cwd=str(ROOT))
    assert result.returncode == 1, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors[0] == ("error: 2 rank(s) do not make a pp x dp x tp mesh with pp = 2 and "
                         "tp = 2: W must be a multiple of 4 (e.g. 4 or 8)"), result.stderr[-2000:]
    assert len(errors) == 2 and "summary:" not in result.stdout  # + torchrun's own line
