"""Lesson 10's pipeline steps, each against lesson10_transformer.py (DDP) on as many processes as
it has data-parallel rows: the same global batch, read in the same order, from the same seeded
first weights; one epoch each, every job run once (a module-scoped fixture).

- lesson10_pipeline.py: the transformer's 4 pieces as pipeline stages. W = 2 (one row of 2
  ranks) under GPipe, 1F1B (a stage a rank) and interleaved zero bubble (4 stages, 2 a rank)
  trains one process's weights; W = 4 (2 rows of 2, interleaved 1F1B) trains DDP's on 2, so the
  rows' gradients are averaged right; one process holding both stages of interleaved 1F1B
  trains its own. A --pp that does not divide the micro-batches is one line.
- lesson10_3d.py: pp x dp x tp = 2 x 2 x 2 on 8 processes (GPipe over FSDP2 x TP stages) trains
  DDP's weights on 2.
"""

import pytest
import torch
from util import ROOT, runs_once

from ddpcourse.cluster.launch import launch

# Lesson 10's runs of 3 to 8 processes run in `make test-lesson10` (CI too): with them
# `make test` would pass its five minutes.
pytestmark = pytest.mark.lesson10

TOLERANCE = 1e-5  # float32 sums in another order (micro-batches, TP's partial sums, FSDP)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """trained(script, nproc, *args): (summary, checkpoint, stdout) of one epoch, run once."""
    return runs_once(tmp_path_factory.mktemp("lesson10_pipeline_steps"))


def assert_same_training(got, want):
    """The same weights (whole tensors under the same names, within TOLERANCE), loss and
    validation accuracy."""
    (facts, saved, _), (expected, wanted, _) = got, want
    got_weights, want_weights = saved["model"], wanted["model"]
    assert set(got_weights) == set(want_weights)
    for name, weight in want_weights.items():
        assert type(got_weights[name]) is torch.Tensor, name
        assert got_weights[name].shape == weight.shape, name
    worst = max((got_weights[n] - want_weights[n]).abs().max().item() for n in want_weights)
    assert worst < TOLERANCE, f"largest weight difference {worst:.1e}"
    assert abs(float(facts["train_loss"]) - float(expected["train_loss"])) < 1e-3
    assert facts["val_acc"] == expected["val_acc"]


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("schedule, stages", [("gpipe", 2), ("1f1b", 2), ("interleaved-zb", 4)])
def test_a_pipeline_of_two_ranks_trains_one_process_s_weights(trained, schedule, stages):
    pipeline = trained("lesson10_pipeline.py", 2, "--schedule", schedule)
    facts, _, stdout = pipeline
    assert (facts["world_size"], facts["batch_per_process"], facts["global_batch"]) == (
        "2", "256", "256")  # one row (dp = 1) of 2 ranks, the default pp at W = 2
    assert f"global batch 256 = 1 row(s) x 256, {stages} stage(s)" in stdout, stdout
    assert_same_training(pipeline, trained("lesson10_transformer.py", 1))


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_two_rows_of_interleaved_pipelines_train_ddp_s_weights_on_two(trained):
    pipeline = trained("lesson10_pipeline.py", 4, "--schedule", "interleaved-1f1b")
    facts, _, stdout = pipeline
    assert (facts["world_size"], facts["batch_per_process"]) == ("4", "128")
    assert "global batch 256 = 2 row(s) x 128, 4 stage(s)" in stdout, stdout
    assert_same_training(pipeline, trained("lesson10_transformer.py", 2))


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_both_interleaved_stages_on_one_process_train_its_weights(trained):
    pipeline = trained("lesson10_pipeline.py", 1, "--schedule", "interleaved-1f1b")
    assert "global batch 256 = 1 row(s) x 256, 2 stage(s)" in pipeline[2], pipeline[2]
    assert_same_training(pipeline, trained("lesson10_transformer.py", 1))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_pipeline_that_does_not_divide_the_micro_batches_is_one_line():
    result = launch("scripts/lesson10_pipeline.py", ["--micro-batches", "3"], nproc=2,
                    timeout=90, cwd=str(ROOT), capture=True, echo=False)
    message = "error: --pp 2 must divide W = 2 and --micro-batches, be <= 4"
    assert result.returncode == 1, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error")]
    assert errors[0] == message and errors.count(message) == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr.split(message)[0], result.stderr[-2000:]
    assert "summary:" not in result.stdout


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_three_d_on_eight_processes_trains_ddp_s_weights_on_two(trained):
    three_d = trained("lesson10_3d.py", 8)
    facts, _, stdout = three_d
    assert (facts["world_size"], facts["batch_per_process"], facts["global_batch"]) == (
        "8", "128", "256")  # 2 rows of 128: DDP's 2 ranks of 128
    assert "2 x 2 x 2 (pp x dp x tp): global batch 256 = 2 row(s) x 128" in stdout, stdout
    assert_same_training(three_d, trained("lesson10_transformer.py", 2))
