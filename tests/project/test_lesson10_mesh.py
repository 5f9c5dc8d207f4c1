"""Groundwork for lesson 10, run for real on gloo at W = 4 (a 2 x 2 mesh): every group of a
device mesh is the one the row-major arithmetic gives, and an all_reduce in it reaches exactly
its ranks (the 3-D mesh of W = 8 checked in one process with the fake backend); FSDP2 x tensor
parallelism and HSDP train equal to one process, and each mesh dimension carries exactly the
predicted collectives, count and bytes; sequence parallelism equals one process, replaces
every all_reduce by an all_gather and a reduce_scatter of the same size, and keeps the
predicted bytes of activations for backward, fewer than plain tensor parallelism.

Each job is launched once (module-scoped fixtures) and checked several ways. The numbers below
are worked out by hand from the scripts' default shapes, apart from the scripts' own arithmetic.
"""

import re
import textwrap

import pytest
from util import PYTHON, ROOT, run, summary

from ddpcourse.cluster.launch import launch
from ddpcourse.report import parse_table

# Lesson 10's runs of 3 to 8 processes run in `make test-lesson10` (CI too): with them
# `make test` would pass its five minutes.
pytestmark = pytest.mark.lesson10

MESH = "scripts/experiments/lesson10_mesh.py"
TWO_D = "scripts/experiments/lesson10_two_d.py"
SEQUENCE = "scripts/experiments/lesson10_sequence_parallel.py"
WORLD = 4
TOLERANCE = 1e-5
F32 = 4


def launched(script: str, args: list[str], world: int = WORLD) -> str:
    result = launch(script, args, nproc=world, timeout=90, capture=True, echo=False,
                    backend="gloo", cwd=str(ROOT))
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return result.stdout


@pytest.fixture(scope="module")
def mesh_job():
    return launched(MESH, [])


@pytest.fixture(scope="module")
def two_d_job():
    return launched(TWO_D, [])


@pytest.fixture(scope="module")
def sequence_job():
    return launched(SEQUENCE, [])


def table_after(text: str, heading: str) -> list[dict[str, str]]:
    """The table printed after the line that starts with `heading`."""
    return parse_table(text[text.index(heading):])


def counted(rows, setup: str) -> dict:
    """{(collective, dimension): (count, bytes)} of one setup, checking predicted == measured."""
    found = {}
    for row in rows:
        if row["setup"] == setup:
            assert row["predicted"] == row["measured"], row
            assert row["predicted bytes"] == row["measured bytes"], row
            assert row["check"] == "same", row
            found[row["collective"], row["dimension"]] = (int(row["measured"]),
                                                         int(row["measured bytes"]))
    return found


# --- the mesh -------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(150)
def test_every_mesh_group_is_the_arithmetics(mesh_job):
    rows = parse_table(mesh_job)
    assert [int(row["rank"]) for row in rows] == list(range(WORLD)), mesh_job
    for row in rows:
        rank = int(row["rank"])
        dp, tp = divmod(rank, 2)  # rank = dp x 2 + tp
        column = [tp, 2 + tp]     # same tp coordinate: the dp group
        line = [2 * dp, 2 * dp + 1]  # same dp coordinate: the tp group
        assert row["coordinates"] == f"{dp},{tp}", row
        assert row["dp group"] == ",".join(map(str, column)), row
        assert row["tp group"] == ",".join(map(str, line)), row
        # each rank added 2^rank: the sum names the ranks that took part
        for name, group in (("dp", column), ("tp", line)):
            total = sum(1 << r for r in group)
            assert row[f"all_reduce {name}"] == f"{total} = ranks {','.join(map(str, group))}"
        assert row["check"] == "same", row
    assert "mesh 2 x 2 (dp, tp): [[0, 1], [2, 3]]" in mesh_job
    facts = summary(mesh_job)
    assert facts["meshes"] == "2x2" and facts["groups_match"] == "True", facts


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_the_3d_mesh_of_8_ranks_is_the_arithmetics_too():
    # Eight ranks are more processes than a test may start: one process plays each rank in
    # turn with the fake backend (no traffic; the groups are real).
    code = textwrap.dedent("""
        import torch.distributed as dist
        import torch.testing._internal.distributed.fake_pg  # registers the "fake" backend
        from torch.distributed.device_mesh import init_device_mesh
        names = ("pp", "dp", "tp")
        for rank in range(8):
            dist.init_process_group("fake", rank=rank, world_size=8, store=dist.HashStore())
            mesh = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=names)
            groups = [dist.get_process_group_ranks(mesh.get_group(n)) for n in names]
            print(rank, *mesh.get_coordinate(), *(",".join(map(str, g)) for g in groups))
            dist.destroy_process_group()
    """)
    result = run([PYTHON, "-c", code], timeout=50)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.split("\n")[:8]
    for rank, line in enumerate(lines):
        pp, dp, tp = rank // 4, rank // 2 % 2, rank % 2  # rank = pp x 4 + dp x 2 + tp
        expected = [rank, pp, dp, tp, f"{dp * 2 + tp},{4 + dp * 2 + tp}",
                    f"{pp * 4 + tp},{pp * 4 + 2 + tp}", f"{rank - tp},{rank - tp + 1}"]
        assert line.split() == [str(x) for x in expected], result.stdout


# --- FSDP2 x TP and HSDP --------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(150)
def test_two_d_training_equals_one_process(two_d_job):
    diffs = {setup: float(d) for setup, d in re.findall(
        r"^(fsdp x tp|hsdp): losses .*; largest parameter difference from one process (\S+);"
        r" every rank and step counted alike: True$", two_d_job, re.M)}
    assert sorted(diffs) == ["fsdp x tp", "hsdp"], two_d_job
    assert all(d < TOLERANCE for d in diffs.values()), diffs
    facts = summary(two_d_job)
    assert facts["mesh"] == "2x2" and facts["same_as_one_process"] == "True", facts
    assert float(facts["max_diff"]) < TOLERANCE


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_each_mesh_dimension_carries_the_predicted_collectives(two_d_job):
    rows = table_after(two_d_job, "collectives of one training step")
    # Defaults: 2 blocks of LayerNorm(16), Linear(16, 64), Linear(64, 16); a final
    # LayerNorm(16); global batch 24 x 8 tokens; dp = tp = 2.
    norm = 2 * 16
    tp_block = norm + (32 * 16 + 32) + (16 * 32 + 16)  # up's rows / 2, down's columns / 2
    whole_block = norm + (64 * 16 + 64) + (16 * 64 + 16)
    # FSDP units: both blocks and the root (the final norm); the root is not resharded after
    # forward, so backward gathers the two blocks only.
    assert counted(rows, "fsdp x tp") == {
        ("all_gather", "dp"): (3 + 2, ((2 * tp_block + norm) + 2 * tp_block) * F32),
        ("reduce_scatter", "dp"): (3, (2 * tp_block + norm) * F32),
        # per block, forward and backward: an activation of 12 samples x 8 tokens x 16
        ("all_reduce", "tp"): (2 * 2, 2 * 2 * 12 * 8 * 16 * F32)}
    assert counted(rows, "hsdp") == {
        ("all_gather", "shard"): (3 + 2, ((2 * whole_block + norm) + 2 * whole_block) * F32),
        ("reduce_scatter", "shard"): (3, (2 * whole_block + norm) * F32),
        ("all_reduce", "replicate"): (3, (2 * whole_block + norm) // 2 * F32)}
    assert summary(two_d_job)["collectives_as_predicted"] == "True"


# --- sequence parallelism -------------------------------------------------------------------

# lesson10_sequence_parallel.py's defaults: 2 blocks, 16 -> 120 -> 16, batch 2 x 60 tokens
TOKENS, FEATURES, HIDDEN = 2 * 60, 16, 120


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_sequence_parallel_equals_one_process(sequence_job):
    found = re.findall(r"^(tensor parallel|sequence parallel): largest difference from one "
                       r"process: output (\S+), input grad (\S+), parameter grads (\S+)$",
                       sequence_job, re.M)
    assert [f[0] for f in found] == ["tensor parallel", "sequence parallel"], sequence_job
    assert all(float(d) < TOLERANCE for f in found for d in f[1:]), found
    facts = summary(sequence_job)
    assert facts["world_size"] == str(WORLD) and facts["same_as_one_process"] == "True"


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_all_gather_and_reduce_scatter_replace_all_reduce(sequence_job):
    rows = table_after(sequence_job, "collectives of one forward and backward")
    activation = TOKENS * FEATURES * F32  # batch x seq x features, whole
    assert counted(rows, "tensor parallel") == {("all_reduce", "tp"): (4, 4 * activation)}
    assert counted(rows, "sequence parallel") == {
        ("all_gather", "tp"): (4, 4 * activation),
        ("reduce_scatter", "tp"): (4, 4 * activation),
        # three norms' weight and bias gradients, Partial until summed over the ranks
        ("all_reduce", "tp"): (6, 6 * FEATURES * F32)}


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_sequence_parallel_keeps_the_predicted_activations(sequence_job):
    rows = {row["setup"]: row for row in table_after(sequence_job, "activations saved")}
    whole, norm = TOKENS * FEATURES, TOKENS * FEATURES + 2 * TOKENS  # a norm: input, mean, 1/std
    gelu = 2 * TOKENS * HIDDEN // WORLD                             # up's output, gelu's output
    plain = (2 * (norm + whole + gelu) + norm) * F32
    split = (2 * (norm // WORLD + whole + gelu) + norm // WORLD) * F32  # up's input: gathered
    for setup, expected in (("tensor parallel", plain), ("sequence parallel", split)):
        assert rows[setup]["saved bytes per rank"] == ",".join([str(expected)] * WORLD)
        assert rows[setup]["predicted"] == str(expected) and rows[setup]["check"] == "same"
    facts = summary(sequence_job)
    assert facts["as_predicted"] == "True", facts
    assert int(facts["memory_saved"]) == int(facts["predicted_saving"]) == plain - split > 0


# --- bad input ------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(150)
@pytest.mark.parametrize("script, world, args, message", [
    (MESH, 3, [], "error: 3 rank(s) make no 2-D mesh with 2 ranks or more in each dimension "
                  "(W must be a product of two such numbers: e.g. 4, 6 or 9)"),
    (MESH, 4, ["--tp", "3"], "error: 4 rank(s) do not make a 2-D mesh with a tp dimension of 3: "
                             "W must be 3 x dp with dp >= 2 (e.g. 6 or 9)"),
    (TWO_D, 2, [], "error: 2 rank(s) do not make a 2-D mesh with a tp dimension of 2: W must be "
                   "2 x dp with dp >= 2 (e.g. 4 or 6)"),
    (SEQUENCE, 2, ["--seq", "61"], "error: --seq 61 does not split evenly over 2 ranks; use a "
                                   "multiple of 2"),
], ids=["mesh_prime", "mesh_tp", "two_d", "sequence_parallel"])
def test_a_world_that_does_not_fit_is_refused_in_one_line(script, world, args, message):
    result = launch(script, args, nproc=world, timeout=90, capture=True, echo=False,
                    backend="gloo", cwd=str(ROOT))
    assert result.returncode == 1, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors[0] == message and len(errors) == 2, result.stderr[-2000:]  # + torchrun's
    assert "summary:" not in result.stdout
