"""Lesson 9's libraries train lesson 3's model to the very weights lesson 3's DDP does.

scripts/experiments/lesson9_same_weights.py runs, at W = 2 and W = 3, lesson 3's step and then
Lightning's Fabric and its Trainer (each started by plain `python`, the library starting the
other processes, and by torchrun), Accelerate, DeepSpeed's ZeRO stages 0-3 (and stage 2
started by DeepSpeed's own launcher) and lesson 3's step on a Dask cluster's workers, with
the same seed, data order and global batch. Every final state dict must equal lesson 3's bit
for bit, except where the scripts say why not: DeepSpeed at W = 3 (its average taken in
another order: close), DeepSpeed with its own defaults (its gradients clipped: another run)
and Accelerate's own loader (another order of the data: another run). And
scripts/experiments/lesson9_launchers.py's table of what each launcher gives its workers is
checked against what it must show.

`make test-lesson9` installs lesson 9's packages (requirements-lesson9.txt) into .venv and
runs these; without the packages they skip, saying why. On the CPU with gloo, as every test.
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ddpcourse.cluster.launch import launch
from ddpcourse.report import parse_table

for library in ("lightning", "accelerate", "deepspeed", "distributed"):
    pytest.importorskip(library, reason="lesson 9's packages are not installed "
                                        "(make test-lesson9 installs them)")

ROOT = Path(__file__).resolve().parents[2]
EPOCHS = ["--epochs", "2"]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("world", [2, 3])
def test_every_library_trains_to_lesson_3_s_weights_or_says_why_not(world):
    result = subprocess.run([sys.executable, "scripts/experiments/lesson9_same_weights.py",
                             "--world-sizes", str(world)], cwd=ROOT, capture_output=True,
                            text=True, timeout=880)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    rows = parse_table(result.stdout)
    assert len(rows) == 13 and {r["W"] for r in rows} == {str(world)}
    for row in rows:
        differing = int(row["tensors not equal"].split(" of ")[0])
        gap, what = float(row["max |gap|"]), f"{row['library']} ({row['started by']})"
        if row["library"] in ("Accelerate, its own loader", "DeepSpeed ZeRO-0, its defaults"):
            assert differing > 46, what  # another data order, or clipped: another run
        elif row["library"].startswith("DeepSpeed") and world == 3:
            assert 0 < gap < 0.1, what  # the last bit of 1/3, grown over two epochs
        else:
            assert (differing, gap) == (0, 0.0), what
    assert {(r["library"], r["started by"]) for r in rows} >= {
        ("Fabric", "python"), ("Fabric", "torchrun"), ("Trainer", "python"),
        ("Trainer", "torchrun"), ("Dask workers", "dask"), ("DeepSpeed ZeRO-3", "torchrun"),
        ("DeepSpeed ZeRO-2", "deepspeed")}
    # DeepSpeed's launcher changes nothing in the training: the same weights as under torchrun.
    stage_2 = [(r["tensors not equal"], r["max |gap|"]) for r in rows
               if r["library"] == "DeepSpeed ZeRO-2"]
    assert len(stage_2) == 2 and stage_2[0] == stage_2[1]


def weights(path: Path) -> dict:
    return torch.load(path, weights_only=False)["model"]


@pytest.mark.timeout(120)
def test_deepspeed_with_its_defaults_refuses_torch_s_sgd_from_stage_1_in_one_line(tmp_path):
    result = launch("scripts/lesson9_deepspeed.py", ["--zero-stage", "1", "--deepspeed-defaults",
                                                     "--checkpoint", str(tmp_path / "x.pt")],
                    nproc=2, timeout=100, cwd=str(ROOT), capture=True, echo=False,
                    backend="gloo")
    assert result.returncode != 0
    refusals = [line for line in (result.stdout + result.stderr).splitlines()
                if "refuses" in line]  # once: rank 0 says it for every rank
    assert refusals == ['error: DeepSpeed refuses: You are using an untested ZeRO Optimizer. '
                        'Please add <"zero_allow_untested_optimizer": true> in the '
                        'configuration file to use it.']


@pytest.mark.timeout(120)
def test_accelerate_without_gpus_refuses_to_train_each_process_alone(tmp_path):
    # Accelerator() without cpu=True on a machine without GPUs: every process alone. The
    # script passes cpu=True; a copy without it must stop with one line, not train.
    text = (ROOT / "scripts" / "lesson9_accelerate.py").read_text()
    assert "Accelerator(cpu=not torch.cuda.is_available()," in text
    broken = tmp_path / "lesson9_accelerate.py"
    broken.write_text(text.replace("Accelerator(cpu=not torch.cuda.is_available(),",
                                   "Accelerator("))
    result = launch(str(broken), ["--epochs", "1"], nproc=2, timeout=100, cwd=str(ROOT),
                    capture=True, echo=False, backend="gloo")
    assert result.returncode != 0
    assert "error: Accelerate sees 1 process(es) of 2" in result.stdout + result.stderr


@pytest.mark.timeout(300)
def test_on_dask_every_rank_is_a_worker_process_and_the_root_only_a_client(tmp_path):
    result = subprocess.run([sys.executable, "scripts/lesson9_dask.py", "--workers", "3",
                             "--timeout", "240", "--", *EPOCHS, "--checkpoint",
                             str(tmp_path / "final.pt")],
                            cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    pids = re.search(r"^Dask: the ranks ran in worker processes \[([\d, ]+)\]; this process, "
                     r"the client, is (\d+);", result.stdout, re.M)
    ranks, client = pids.group(1).split(", "), pids.group(2)
    assert len(set(ranks)) == 3 and client not in ranks
    assert weights(tmp_path / "final.pt")  # rank 0 saved its weights


@pytest.mark.timeout(120)
def test_a_rank_that_stops_on_dask_ends_the_run_with_one_line():
    result = subprocess.run([sys.executable, "scripts/lesson9_dask.py", "--workers", "3",
                             "--timeout", "60", "--", "--epochs", "-1"],
                            cwd=ROOT, capture_output=True, text=True, timeout=110)
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == "error: rank 0: lesson3_ddp.py stopped: 2"


@pytest.mark.timeout(600)
def test_the_launchers_table_is_what_each_launcher_really_gives_its_workers():
    result = subprocess.run([sys.executable, "scripts/experiments/lesson9_launchers.py"],
                            cwd=ROOT, capture_output=True, text=True, timeout=580)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    rows = {}
    for row in parse_table(result.stdout):
        rows.setdefault(row["launcher"], []).append(row)
    assert sorted(rows) == sorted(["torchrun", "Fabric, python", "Trainer, python",
                                   "accelerate launch", "deepspeed", "Dask"])
    assert all(len(workers) == 2 for workers in rows.values())
    for name in ("torchrun", "accelerate launch"):  # torchrun's code: every variable
        assert [(w["RANK"], w["LOCAL_RANK"], w["GROUP_RANK"]) for w in rows[name]] == [
            ("0", "0", "0"), ("1", "1", "0")], name
    for name in ("Fabric, python", "Trainer, python"):
        # Lightning runs the script again: no RANK; NODE_RANK and LOCAL_RANK give it. The
        # process started by python is rank 0 and started rank 1.
        assert [(w["RANK"], w["LOCAL_RANK"], w["NODE_RANK"], w["started by"])
                for w in rows[name]] == [("-", "0", "0", "is the launcher"),
                                         ("-", "1", "0", "the launcher")], name
    # DeepSpeed's launcher adds --local_rank and sets CUDA_VISIBLE_DEVICES, even on a CPU.
    assert [(w["added args"], w["CUDA_VISIBLE_DEVICES"]) for w in rows["deepspeed"]] == [
        ("--local_rank=0", "0,1"), ("--local_rank=1", "0,1")]
    # Dask gives its workers none of them: the task sets what it needs (lesson9_dask.py).
    assert all(w["RANK"] == w["WORLD_SIZE"] == w["MASTER_ADDR"] == "-" for w in rows["Dask"])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("script", ["scripts/lesson9_fabric.py", "scripts/lesson9_lightning.py"])
def test_a_bad_batch_under_the_library_s_own_launcher_is_one_line_and_leaves_nothing(script):
    # Checked before the library starts the other processes: nothing would stop them after.
    result = subprocess.run([sys.executable, script, "--devices", "2", "--batch-size", "3"],
                            cwd=ROOT, capture_output=True, text=True, timeout=100,
                            start_new_session=True)
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == ("error: the global batch 3 does not split evenly "
                                              "over 2 processes; use a multiple of 2")
    assert "rank 1" not in result.stderr  # never started, so never left waiting
    leftover = subprocess.run(["pgrep", "-f", f"{script} --devices 2 --batch-size 3"],
                              capture_output=True, text=True).stdout.split()
    assert leftover == []
