"""Lesson 8 run for real: ZeRO-1 and FSDP2 train exactly as DDP does; every rank's measured
bytes agree with ddpcourse.sharding's prediction at W = 1, 2 and 3; an FSDP checkpoint saved
sharded at W = 2 loads at W = 3, and in one process, to the same weights; a pipeline over two
processes matches the unsplit model, with a bubble near (S-1)/(M+S-1); DTensor's column and
row splits equal the dense layers, with the collectives that join them. The calculator counts
as the ZeRO paper does, beside its Figure 1; a step on 1,024 GPUs is predicted by the cost model.

Each job is launched once (module-scoped fixtures) and checked many ways. The W = 2 memory,
pipeline and tensor-parallel jobs are the notebook's too (the job cache runs each once).
"""

import argparse
import math
import re

import pytest
from util import PYTHON, ROOT, run, summary

from ddpcourse.cluster.launch import launch
from ddpcourse.report import parse_table
from ddpcourse.sharding import (
    fingerprint,
    fsdp_rows,
    parameter_count,
    predict,
    transformer_shapes,
    zero_owners,
    zero_stage_bytes,
)

MARGIN = 0.001  # lesson8_memory.py's stated margin: 0.1 % of a rank's total
MICRO, STAGES, WIDTH = 4, 2, 768  # the pipeline job's micro-batches, stages and block width


# --- the calculator (no processes) ----------------------------------------------------------

def test_zero_deals_whole_parameters_largest_first_to_the_emptiest_rank():
    # 10 -> rank 0; 6 -> rank 1; 5 -> rank 1 (it holds 6, rank 0 holds 10); 1 -> rank 0
    assert zero_owners([5, 10, 6, 1], 2) == [1, 0, 1, 0]
    assert zero_owners([4, 4, 4, 4], 3) == [0, 1, 2, 0]  # ties: the lowest rank, in order
    assert zero_owners([7], 4) == [0]


def test_fsdp_pieces_are_torch_chunks_padded_to_equal_size():
    assert [fsdp_rows(10, 4, r) for r in range(4)] == [(3, 3), (3, 3), (3, 3), (1, 3)]
    assert [fsdp_rows(2, 4, r) for r in range(4)] == [(1, 1), (1, 1), (0, 1), (0, 1)]
    pieces = predict([(10, 96), (10,)], 4, "fsdp", "adam")
    assert [p["params"] for p in pieces] == [4 * (3 * 96 + 3)] * 4  # padded
    assert sum(p["optimizer"] for p in pieces) == 2 * 4 * (10 * 96 + 10)  # unpadded state


def test_a_7b_model_on_8_ranks():
    shapes = transformer_shapes()
    n = sum(math.prod(s) for s in shapes)
    assert 6.7e9 < n < 6.8e9
    ddp, zero, fsdp = (max(r["total"] for r in predict(shapes, 8, s, "adam"))
                       for s in ("ddp", "zero", "fsdp"))
    # 4 + 4 + 8 bytes, all on every rank, and 4 more: DDP's buckets, a copy of the gradients
    assert ddp == 20 * n
    assert 12 * n + n < zero < 12 * n + 1.02 * n      # optimizer state over 8, nearly even
    assert 2 * n <= fsdp < 2 * n * 1.001              # everything over 8, a little padding


@pytest.mark.slow
def test_the_calculator_prints_the_table_and_refuses_a_bad_world_size():
    result = run([PYTHON, "-m", "ddpcourse.sharding", "--model", "7b", "--world-size", "8"],
                 timeout=60)
    assert result.returncode == 0, result.stderr
    rows = {row["strategy"]: row for row in parse_table(result.stdout)}
    assert rows["ddp"]["total GB"] == "134.77" and rows["fsdp"]["total GB"] == "13.48"
    bad = run([PYTHON, "-m", "ddpcourse.sharding", "--world-size", "0"], timeout=60)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr


def gb_text(n_bytes: float) -> str:
    """GB as the calculator prints them: one decimal, or three digits below 1 GB."""
    return f"{n_bytes / 1e9:,.1f}" if n_bytes >= 1e9 else f"{n_bytes / 1e9:.3g}"


def zero_paper_totals(n: int, world: int) -> dict[str, float]:
    """The ZeRO paper's stages, mixed precision with Adam: 2 + 2 + 12 bytes per parameter,
    each stage sharding one more term over `world` ranks (shards of ceil(n / world))."""
    shard = -(-n // world)
    return {"DDP": 16 * n, "ZeRO-1": 4 * n + 12 * shard, "ZeRO-2": 2 * n + 14 * shard,
            "ZeRO-3": 16 * shard}


def test_a_parameter_count_is_read_exactly_or_refused():
    assert parameter_count("7.5b") == parameter_count("7.5e9") == 7_500_000_000
    assert parameter_count("1.3e9") == 1_300_000_000 and parameter_count("350m") == 350_000_000
    assert parameter_count("6,738,415,616") == 6_738_415_616 and parameter_count("1") == 1
    for bad in ("0", "-5", "abc", "1.5", "7.5x", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            parameter_count(bad)


def test_a_zero_shard_is_the_fullest_ranks_share():
    # 10 parameters over 4 ranks: 3 each (padded); 3 over 8: 1 each; fp32 Adam, 4 + 4 + 8
    assert zero_stage_bytes(10, 4, "zero3") == {"params": 12, "grads": 12, "optimizer": 24,
                                                "total": 48}
    assert zero_stage_bytes(3, 8, "zero2", "mixed") == {"params": 6, "grads": 2,
                                                        "optimizer": 12, "total": 20}
    assert zero_stage_bytes(10, 4, "ddp", optimizer="sgd")["total"] == 80


@pytest.mark.parametrize("args", [["--zero-paper"],
                                  ["--params", "7.5b", "--world-size", "64", "--precision",
                                   "mixed"]])
def test_the_calculator_reproduces_the_zero_papers_figure_1(args):
    """7.5 B parameters on 64 GPUs, mixed precision, Adam: 120, 31.4, 16.6 and 1.9 GB, the
    calculator's own arithmetic beside the paper's printed figures."""
    result = run([PYTHON, "-m", "ddpcourse.sharding", *args], timeout=60)
    assert result.returncode == 0, result.stderr
    rows = {row["stage"]: row for row in parse_table(result.stdout)}
    expected = zero_paper_totals(7_500_000_000, 64)
    assert [gb_text(expected[s]) for s in rows] == ["120.0", "31.4", "16.6", "1.9"]
    for stage, row in rows.items():
        assert row["total GB"] == gb_text(expected[stage]) == row["paper GB"], row
        parts = sum(float(row[f"{p} GB"].replace(",", "")) for p in ("params", "grads",
                                                                     "optimizer"))
        assert parts == pytest.approx(expected[stage] / 1e9, abs=0.15)  # the terms add up
    assert rows["ZeRO-3"]["params GB"] == gb_text(2 * 117_187_500)  # 7.5 B / 64 in bf16


def test_another_case_gets_no_paper_column_and_its_own_arithmetic():
    result = run([PYTHON, "-m", "ddpcourse.sharding", "--params", "7.5b", "--world-size", "48",
                  "--precision", "mixed"], timeout=60)
    assert result.returncode == 0, result.stderr
    rows = {row["stage"]: row for row in parse_table(result.stdout)}
    expected = zero_paper_totals(7_500_000_000, 48)
    assert "paper GB" not in result.stdout
    assert {s: r["total GB"] for s, r in rows.items()} == {s: gb_text(b)
                                                           for s, b in expected.items()}
    fp32 = run([PYTHON, "-m", "ddpcourse.sharding", "--params", "350m", "--world-size", "1024",
                "--optimizer", "sgd_momentum"], timeout=60)
    rows = {row["stage"]: row for row in parse_table(fp32.stdout)}
    shard = -(-350_000_000 // 1024)  # 4 + 4 + 4 bytes: weights, gradients, the momentum
    assert rows["ZeRO-1"]["total GB"] == gb_text(8 * 350_000_000 + 4 * shard)
    assert rows["ZeRO-3"]["total GB"] == gb_text(12 * shard)


# --- memory and equivalence: DDP, ZeRO-1, FSDP2 ----------------------------------------------

@pytest.fixture(scope="module")
def memory_job():
    """experiments/lesson8_memory.py's output at a world size, each run once; W = 2 is the
    notebook's job (3 steps), the others take 1 step."""
    jobs = {}

    def output(world: int) -> str:
        if world not in jobs:
            args = [] if world == 2 else ["--steps", "1"]
            jobs[world] = launch("scripts/experiments/lesson8_memory.py", args, nproc=world,
                                 timeout=240, capture=True, backend="gloo")
        result = jobs[world]
        assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
        return result.stdout
    return output


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_zero_and_fsdp_train_exactly_as_ddp(memory_job):
    out = memory_job(2)
    losses = re.findall(r"^step \d+/3  loss  ddp (\S+)  zero (\S+)  fsdp (\S+)$", out, re.M)
    assert len(losses) == 3, out
    for ddp, zero, fsdp in losses:
        assert abs(float(zero) - float(ddp)) <= 1e-5 * float(ddp)
        assert abs(float(fsdp) - float(ddp)) <= 1e-5 * float(ddp)
    assert float(losses[-1][0]) < float(losses[0][0])  # and they learn
    for strategy in ("zero", "fsdp"):
        weight = re.search(rf"^check: {strategy} matches ddp over 3 steps .*largest weight "
                           r"difference (\S+),", out, re.M)
        assert weight and float(weight.group(1)) <= 1e-6, out
    assert summary(out)["same_training"] == "True"


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [1, 2, 3])
def test_every_ranks_measured_bytes_agree_with_the_prediction(world, memory_job):
    out = memory_job(world)
    numel = int(re.search(r"^test_resnet: ([\d,]+) parameters", out, re.M).group(1)
                .replace(",", ""))
    rows = parse_table(out)
    assert len(rows) == 3 * world, out
    held = {}
    for row in rows:
        measured = {k: float(row[f"{k} MB"]) * 1e6
                    for k in ("params", "grads", "buckets", "optimizer")}
        total, predicted = float(row["total MB"]) * 1e6, float(row["predicted MB"]) * 1e6
        assert abs(total - sum(measured.values())) < 2e3  # the table adds up (rounding)
        assert abs(total - predicted) <= MARGIN * predicted + 1e3, row  # the stated margin
        held.setdefault(row["strategy"], []).append(measured)
    whole, adam = 4 * numel, 8 * numel  # fp32 weights; Adam's two moments
    for rank in held["ddp"]:  # DDP: everything on every rank, and buckets: the gradients again
        assert rank["params"] == pytest.approx(whole, abs=1e3)
        assert rank["grads"] == pytest.approx(whole, abs=1e3)
        assert rank["buckets"] == pytest.approx(whole, abs=1e3)
        assert rank["optimizer"] == pytest.approx(adam, abs=2e3)  # + Adam's step counters
    # ZeRO-1: whole weights and gradients; the optimizer state split, summed it is DDP's.
    assert all(r["params"] == pytest.approx(whole, abs=1e3) for r in held["zero"])
    assert all(r["buckets"] == pytest.approx(whole, abs=1e3) for r in held["zero"])  # in DDP
    assert all(r["buckets"] == 0 for r in held["fsdp"])  # no DDP: no buckets
    assert sum(r["optimizer"] for r in held["zero"]) == pytest.approx(adam, abs=2e3 * world)
    # FSDP2: every part split; padding makes the weights' pieces a little more than 1/W.
    pieces = sum(r["params"] for r in held["fsdp"])
    assert whole - 1e3 <= pieces <= whole * 1.01
    assert sum(r["optimizer"] for r in held["fsdp"]) == pytest.approx(adam, abs=2e3 * world)
    if world == 3:  # whole parameters do not split evenly: test_resnet's largest is 44 %
        zero_state = [r["optimizer"] for r in held["zero"]]
        assert max(zero_state) > 1.25 * adam / 3 and zero_state[0] == max(zero_state)
        assert max(r["optimizer"] for r in held["fsdp"]) < 1.01 * adam / 3
    assert summary(out)["memory_agrees"] == "True"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_collectives_of_a_step_are_those_of_each_strategy(memory_job):
    out = memory_job(2)
    numel = int(re.search(r"^test_resnet: ([\d,]+) parameters", out, re.M).group(1)
                .replace(",", ""))

    def step(strategy):
        line = re.search(rf"^collectives of one step, {strategy}: (.+)$", out, re.M).group(1)
        return {op: (int(n), int(v.replace(",", ""))) for op, n, v in
                re.findall(r"(\w+) x(\d+) \(([\d,]+) values\)", line)}

    ddp, zero, fsdp = step("ddp"), step("zero"), step("fsdp")
    assert ddp["all_reduce"][1] == numel  # every gradient, once (in buckets)
    assert zero["all_reduce"][1] == numel  # the same, then every parameter from its owner:
    assert zero["broadcast"][1] - numel == ddp["broadcast"][1]  # beside DDP's buffer broadcast
    assert zero["broadcast"][0] > 40  # one broadcast per parameter tensor (47)
    # FSDP2: all-gathers (5 units forward, 4 again in backward: the root stays gathered), each
    # rank giving its half; the reduce-scatter of every gradient, which gloo runs as all_reduce.
    assert fsdp["all_gather"][0] == 9 and numel / 2 < fsdp["all_gather"][1] < numel
    assert fsdp["all_reduce"] == (5, numel)
    assert "broadcast" not in fsdp


# --- a sharded checkpoint, saved at W = 2, loaded at W = 3 and in one process -----------------

@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lesson8_fsdp")
    saved = launch("scripts/lesson8_fsdp_checkpoint.py", ["--epochs", "1", "--checkpoint",
                                                          str(folder / "w2")],
                   nproc=2, timeout=240, capture=True, backend="gloo")
    assert saved.returncode == 0, (saved.stdout + saved.stderr)[-3000:]
    loaded = launch("scripts/lesson8_fsdp_checkpoint.py",
                    ["--epochs", "0", "--resume", str(folder / "w2"),
                     "--checkpoint", str(folder / "w3")],
                    nproc=3, timeout=240, capture=True, backend="gloo")
    assert loaded.returncode == 0, (loaded.stdout + loaded.stderr)[-3000:]
    return folder, saved.stdout, loaded.stdout


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_checkpoint_saved_sharded_at_w2_loads_at_w3_to_the_same_weights(checkpoints):
    folder, saved, loaded = checkpoints
    written = re.search(r"^checkpoint: \S+ \(sharded, 2 writer\(s\)\): weights fingerprint "
                        r"([0-9a-f]{16}) \(92 tensors\)$", saved, re.M)
    # Loaded at W = 3 and, without a step, written again by 3 ranks: the same weights.
    assert re.search(r"^resumed from \S+, now sharded over 3 process\(es\)$", loaded, re.M)
    read = re.search(r"^checkpoint: \S+ \(sharded, 3 writer\(s\)\): weights fingerprint "
                     r"([0-9a-f]{16}) \(92 tensors\)$", loaded, re.M)
    assert written and read, saved + loaded
    assert written.group(1) == read.group(1)
    # Validated after loading, they score what the run that saved them scored.
    validated = re.search(r"^resumed weights: val acc (\S+) \(359 images\); the run that saved "
                          r"them: val acc (\S+)$", loaded, re.M)
    assert validated and validated.group(1) == validated.group(2), loaded
    assert float(summary(loaded)["val_acc"]) == float(summary(saved)["val_acc"]) > 0.2
    assert "train_loss" not in summary(loaded)  # no step taken, so no training loss
    assert sorted(p.name for p in (folder / "w2").iterdir()) == [
        ".metadata", "__0_0.distcp", "__1_0.distcp"]  # a file per rank, and the index
    assert sorted(p.name for p in (folder / "w3").iterdir())[1:] == [
        "__0_0.distcp", "__1_0.distcp", "__2_0.distcp"]
    # Each rank holds its third: every rank's momentum (loaded too) is about a third of DDP's.
    momentum = [float(m) for m in re.findall(r"^rank \d: weights \S+ MB, gradients \S+ MB, "
                                             r"momentum (\S+) MB$", loaded, re.M)]
    assert len(momentum) == 3 and all(abs(m - 1.4946 / 3) < 0.01 for m in momentum), loaded


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_sharded_checkpoint_loads_in_one_process_without_a_group(checkpoints):
    import torch
    import torch.distributed.checkpoint as dcp

    folder, saved, _ = checkpoints
    meta = dcp.FileSystemReader(str(folder / "w2")).read_metadata().state_dict_metadata
    template = {key.removeprefix("model."): torch.empty(m.size, dtype=m.properties.dtype)
                for key, m in meta.items() if key.startswith("model.")}
    state = {"model": template}
    with pytest.warns(UserWarning, match="load in a single process"):
        dcp.load(state, checkpoint_id=str(folder / "w2"))
    assert f"weights fingerprint {fingerprint(state['model'])} " in saved
    # Training learned: the weights moved away from where the same seed starts them.
    assert float(summary(saved)["train_loss"]) < 2.2


# --- a pipeline over two processes ----------------------------------------------------------

@pytest.fixture(scope="module")
def pipeline():
    # The notebook's job: the same arguments, so the job cache runs it once.
    result = launch("scripts/experiments/lesson8_pipeline_bubble.py",
                    ["--micro-batches", str(MICRO)],
                    nproc=STAGES, timeout=240, capture=True, backend="gloo")
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return result.stdout


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_pipeline_trains_as_the_unsplit_model(pipeline):
    steps = re.findall(r"^step \d/4  loss unsplit (\S+)  gpipe M=4 (\S+)  1f1b M=4 (\S+)$",
                       pipeline, re.M)
    assert len(steps) == 4, pipeline
    for unsplit, gpipe, one_f_one_b in steps:
        assert abs(float(gpipe) - float(unsplit)) <= 1e-5 * float(unsplit)
        assert abs(float(one_f_one_b) - float(unsplit)) <= 1e-5 * float(unsplit)
    for row in parse_table(pipeline):
        assert float(row["weight diff"]) <= 1e-6, row
    assert summary(pipeline)["same_as_unsplit"] == "True"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_bubble_is_near_its_formula_and_the_schedules_differ_in_memory(pipeline):
    rows = {row["schedule"]: row for row in parse_table(pipeline)}
    expected = (STAGES - 1) / (MICRO + STAGES - 1)
    for name, row in rows.items():
        assert float(row["(S-1)/(M+S-1)"]) == pytest.approx(expected, abs=1e-3)
        # Measured on a busy machine: waiting for messages and for the CPU adds to it.
        assert expected - 0.08 <= float(row["bubble"]) <= expected + 0.2, (name, row)
        # One message per micro-batch each way between the two stages: activations forward,
        # their gradients back; each one micro-batch of activations (256 / M samples).
        assert int(row["messages"]) == 2 * (STAGES - 1) * MICRO
        assert row["values each"] == str(256 // MICRO * WIDTH)
    # GPipe keeps every micro-batch's activations until the backwards start; 1F1B at most S.
    assert int(rows["gpipe"]["held (stage 0)"]) == MICRO
    assert int(rows["1f1b"]["held (stage 0)"]) == STAGES
    assert (ROOT / "runs" / "lesson8_pipeline_timeline.png").exists()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_lesson_3_s_training_runs_as_a_pipeline_of_two_stages(tmp_path):
    """The step: lesson 3's model cut in two, one stage per process, and it learns."""
    result = launch("scripts/lesson8_pipeline.py", ["--epochs", "2", "--checkpoint",
                                                    str(tmp_path / "pipe.pt")],
                    nproc=2, timeout=240, capture=True, backend="gloo")
    out = result.stdout
    assert result.returncode == 0, (out + result.stderr)[-3000:]
    losses = [float(x) for x in re.findall(r"^epoch \d/2  loss (\S+)", out, re.M)]
    assert len(losses) == 2 and losses[1] < losses[0] < 2.3, out
    assert float(summary(out)["val_acc"]) > 0.3, out
    # each process saved its own stage: the model exists only in pieces
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe_stage0.pt", "pipe_stage1.pt"]


# --- tensor parallelism with DTensor ----------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(300)
def test_column_and_row_splits_equal_the_dense_layers():
    result = launch("scripts/experiments/lesson8_tensor_parallel.py", [], nproc=2, timeout=240,
                    capture=True, backend="gloo")
    out = result.stdout
    assert result.returncode == 0, (out + result.stderr)[-3000:]
    assert re.search(r"^A\. column split, Linear\(768, 480\): weight piece \[240, 768\] per rank, "
                     r"output \(Shard\(dim=1\),\); forward: none; joining the slices: "
                     r"all_gather x1; largest difference from the dense layer (\S+)$", out, re.M)
    # The all-reduces carry activations (batch x features), not weights.
    assert re.search(r"^B\. row split, Linear\(480, 10\): weight piece \[10, 240\] per rank, "
                     r".*forward: all_reduce x1 of 640 values \(the output, 64 x 10\);", out, re.M)
    assert re.search(r"^C\. .*forward: all_reduce x1; backward: none; .*with an input that "
                     r"needs its gradient, backward: all_reduce x1 of 49152 values \(that "
                     r"gradient, 64 x 768\)$", out, re.M)
    for split, dense in re.findall(r"^step \d/5  loss split (\S+)  dense (\S+)$", out, re.M):
        assert abs(float(split) - float(dense)) <= 1e-5
    assert summary(out)["same_as_dense"] == "True" and float(summary(out)["max_diff"]) < 1e-5


# --- rank 0 of a 1,024-rank job, in one process ---------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(300)
def test_rank_0_of_1024_holds_its_predicted_shard_of_a_7b_shaped_model():
    """The fake backend stands in for 1,023 other ranks: the bytes rank 0 really holds after a
    real Adam step are the predictor's, to its stated margin (one block, to stay quick)."""
    result = run([PYTHON, "scripts/experiments/lesson8_scale.py", "--world-size", "1024",
                  "--layers", "1", "--tokens", "4"], timeout=280)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    facts = summary(result.stdout)
    assert facts["world_size"] == "1024" and facts["params_b"] == "0.46", facts
    assert float(facts["worst_diff"]) < MARGIN, facts
    measured, predicted = float(facts["measured_gb"]), float(facts["predicted_gb"])
    # 16 bytes per parameter over 1,024 ranks, a little more for the padding of each piece
    assert 16 * 0.46 / 1024 <= predicted < 16 * 0.47 / 1024 * 1.05
    assert abs(measured - predicted) < 1e-4
    rows = {row["part"]: row for row in parse_table(result.stdout)}
    assert rows["params"]["held MB"] == rows["params"]["predicted MB"], rows
    # torch's FSDPMemTracker watched the same step: the same storages, so the same bytes
    assert all(row["tracker MB"] == row["held MB"] for row in rows.values()), rows
    assert facts["tracker_gb"] == facts["measured_gb"], facts
    # Its peak (forward, one block) holds every parameter gathered twice: the root unit's
    # parameters and its all-gather buffer, kept until the block's copy-out, and the block's
    # buffer and parameters, in the middle of that copy. Each piece is padded to ceil(rows / W).
    gathered = sum(1024 * fsdp_rows(shape[0], 1024, 0)[1] * math.prod(shape[1:]) * 4
                   for shape in transformer_shapes(1))
    tracker_peak, resident_peak = float(facts["tracker_peak_gb"]), float(facts["peak_gb"])
    assert tracker_peak >= round(2 * gathered / 1e9, 2), (facts, gathered)
    # ... and the process's resident peak agrees (/proc's kB read as 1,000 bytes: 2.4 % less)
    assert abs(tracker_peak - resident_peak) <= 0.015 * resident_peak, facts


def hierarchical_ring(n_bytes: float, per_node: int, nodes: int, passes: int,
                      messages: int, node_link: tuple[float, float],
                      net_link: tuple[float, float]) -> float:
    """Lesson 5's all-reduce (passes=2) or all-gather (passes=1) of n bytes: a ring inside
    each node, G-1 steps of n/G bytes, then rings across nodes, N-1 steps of n/(G N) bytes on
    each GPU's own card; every step pays alpha once per message. Links: (alpha, bytes/s)."""
    (node_alpha, node_rate), (net_alpha, net_rate) = node_link, net_link
    inside = (per_node - 1) * (messages * node_alpha + n_bytes / per_node / node_rate)
    across = (nodes - 1) * (messages * net_alpha + n_bytes / (per_node * nodes) / net_rate)
    return passes * (inside + across)


def test_a_step_on_1024_gpus_is_compute_plus_what_the_links_cannot_hide():
    result = run([PYTHON, "scripts/experiments/lesson8_layouts.py"], timeout=60)
    assert result.returncode == 0, result.stderr
    rows = {row["layout"]: row for row in parse_table(result.stdout)}
    seconds = {name: {k: float(v.replace(",", "")) for k, v in row.items() if k.endswith(" s")
                      or k.endswith("links")} for name, row in rows.items()}
    n = sum(math.prod(shape) for shape in transformer_shapes())
    tokens, world = 4 * 2**20, 1024
    compute = 6 * n * tokens / world / (989e12 * 0.4)  # published peak x assumed utilisation
    nvlink, infiniband = (2e-6, 450e9), (5e-6, 50e9)  # published rates, assumed alphas
    for name, t in seconds.items():
        assert t["compute s"] == pytest.approx(compute, abs=6e-4), name
        assert t["step s"] == pytest.approx(t["compute s"] + t["exposed s"] + t["bubble s"],
                                            abs=2e-3), name
    # DDP: the bf16 gradients all-reduced, 8 GPUs a node, 128 nodes, a message per block + 1
    ddp = hierarchical_ring(2 * n, 8, 128, 2, 33, nvlink, infiniband)
    assert seconds["DDP 1024"]["comm s"] == pytest.approx(ddp, abs=6e-4)
    # FSDP: all-gather in forward and in backward, reduce-scatter: three halves of that
    assert seconds["FSDP 1024"]["comm s"] == pytest.approx(1.5 * ddp, abs=6e-4)
    # TP 8: four all-reduces of one sequence's 4096 x 4096 bf16 activations per block, for
    # the 8 sequences of a replica, inside a node and waited for; the gradients' hide
    tensor = 4 * 32 * 8 * hierarchical_ring(4096 * 4096 * 2, 8, 1, 2, 1, nvlink, infiniband)
    assert seconds["TP 8 x DDP 128"]["exposed s"] == pytest.approx(tensor, abs=6e-4)
    # PP 8: a replica's 8 sequences are its micro-batches; the bubble is (S-1)/(M+S-1) of it
    pipeline = seconds["PP 8 x DDP 128"]
    assert (rows["PP 8 x DDP 128"]["S"], rows["PP 8 x DDP 128"]["M"]) == ("8", "8")
    assert pipeline["bubble s"] / (compute + pipeline["bubble s"]) == pytest.approx(7 / 15,
                                                                                  abs=2e-3)
    # memory: 16 bytes per parameter (mixed precision, Adam), over the ranks that shard it
    assert [rows[name]["GB/GPU"] for name in ("DDP 1024", "FSDP 1024", "HSDP 8 x 128")] == [
        gb_text(16 * n), gb_text(16 * -(-n // 1024)), gb_text(16 * -(-n // 8))]
    assert rows["DDP 1024"]["fits 80 GB"] == "no" and rows["HSDP 8 x 128"]["fits 80 GB"] == "yes"
    # the same all-reduce at gloo's loopback alpha and beta, solved from lesson 4's table
    beta = (0.491 - 5.8e-3) / (1.5 * ((256 << 20) - 1024))
    alpha = (5.8e-3 - 1.5 * 1024 * beta) / 6
    loopback = hierarchical_ring(2 * n, 8, 128, 2, 33, (alpha, 1 / beta), (alpha, 1 / beta))
    assert seconds["DDP 1024"]["comm s, gloo links"] == pytest.approx(loopback, abs=0.06)
    # the best: the fastest that fits, ties to the one that sends less
    fitting = [name for name in rows if rows[name]["fits 80 GB"] == "yes"]
    best = min(fitting, key=lambda name: (seconds[name]["step s"], seconds[name]["comm s"]))
    facts = summary(result.stdout)
    assert facts["world_size"] == "1024" and facts["layouts"] == str(len(rows)) == "7"
    assert facts["best"] == best.replace(" x ", "x").replace(" ", "_") == "HSDP_8x128"
    assert facts["step_s"] == rows[best]["step s"] and "measured_gb" not in facts


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_activations_grow_with_every_token_and_checkpointing_keeps_a_fraction():
    result = run([PYTHON, "scripts/experiments/lesson8_activations.py", "--layers", "2",
                  "--width", "128", "--batches", "1,2,4", "--lengths", "32,64",
                  "--repeats", "1"], timeout=180)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    rows = parse_table(result.stdout)
    per_token = {row["KB per token"] for row in rows if "KB per token" in row}
    saved = {(int(r["batch"]), int(r["tokens"])): float(r["saved MB"])
             for r in rows if "tokens" in r}
    assert len(saved) == 6 and len(per_token) == 1, rows  # linear in batch and in length
    assert saved[(4, 64)] == pytest.approx(8 * saved[(1, 32)], rel=0.01)
    facts = summary(result.stdout)
    # every block keeps only its input: a small share, and recomputing changes no gradient
    assert float(facts["memory_ratio"]) < 0.35 and float(facts["grad_diff"]) < 1e-6, facts
    # under FSDP2 a rank keeps the same activations (only the weights are sharded), and
    # checkpointing keeps the same share: the gathered weights are not counted as activations
    assert facts["fsdp_activation_mb"] == facts["activation_mb"], facts
    assert facts["fsdp_memory_ratio"] == facts["memory_ratio"], facts


# --- the scripts' diffs, and bad input ------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("args, message", [
    (["scripts/experiments/lesson8_pipeline_bubble.py", "--micro-batches", "3"],
     "--batch-size 256 must split into equal micro-batches"),
    (["scripts/experiments/lesson8_pipeline_bubble.py", "--schedules", "zigzag"],
     "--schedules: choose from"),
    (["scripts/lesson8_pipeline.py", "--micro-batches", "3"],
     "--micro-batches must divide the batch into equal micro-batches"),
    (["scripts/experiments/lesson8_memory.py", "--steps", "0"],
     "--steps and --batch-size must be at least"),
    (["scripts/experiments/lesson8_tensor_parallel.py", "--hidden", "0"], "must be at least 1"),
    (["scripts/experiments/lesson8_scale.py", "--world-size", "0"], "--world-size must be 1 to"),
    (["scripts/experiments/lesson8_activations.py", "--batches", "two"], "--batches and --lengths"),
    (["-m", "ddpcourse.sharding", "--params", "abc"], "'abc' is not a parameter count"),
    (["-m", "ddpcourse.sharding", "--params", "0"], "a model has 1 to 10^15 parameters"),
    (["-m", "ddpcourse.sharding", "--params=-5"], "a model has 1 to 10^15 parameters"),
    (["-m", "ddpcourse.sharding", "--params", "7.5b", "--world-size", "0"],
     "--world-size must be between 1 and"),
    (["-m", "ddpcourse.sharding", "--zero-paper", "--model", "7b"], "not allowed with"),
    (["scripts/experiments/lesson8_layouts.py", "--world-size", "100"],
     "--world-size must be a multiple of 8"),
])
def test_bad_arguments_are_one_line(args, message):
    result = run([PYTHON, *args], timeout=60)
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and message in result.stderr


@pytest.mark.slow
def test_a_missing_checkpoint_is_one_line(tmp_path):
    result = run([PYTHON, "scripts/lesson8_fsdp_checkpoint.py", "--epochs", "0", "--resume",
                  str(tmp_path / "nothing"), "--checkpoint", str(tmp_path / "out")], timeout=120)
    errors = [line for line in result.stderr.splitlines()
              if not line.startswith("note: not started by torchrun")]
    assert result.returncode == 1 and len(errors) == 1, result.stderr[-2000:]
    assert errors[0] == (f"error: {tmp_path / 'nothing'} is not a checkpoint folder: it has no "
                         ".metadata, the index that dcp.save writes last")
