"""Lesson 9's libraries train lesson 3's model to the very weights lesson 3's DDP does.

Lightning's Fabric and its Trainer, each started two ways (plain `python`, where the library
starts the other processes, and torchrun, where it finds them), and lesson 3's own step run
on a Dask cluster's worker processes, and Accelerate under torchrun, at W = 2 and W = 3, and
DeepSpeed's ZeRO stages 0-2 at W = 2 (at W = 3 its average is taken in another order), against
`torchrun scripts/lesson3_ddp.py` with the same seed, data order and global batch: every
tensor of the final state dict equal, bit for bit.

`make test-lesson9` installs lesson 9's packages (requirements-lesson9.txt) into .venv and
runs these; without the packages they skip, saying why. On the CPU with gloo, as every test.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ddpcourse.cluster.launch import launch

pytest.importorskip("lightning", reason="lesson 9's packages are not installed "
                                        "(make test-lesson9 installs them)")

ROOT = Path(__file__).resolve().parents[2]
EPOCHS = ["--epochs", "2"]


def weights(path: Path) -> dict:
    return torch.load(path, weights_only=False)["model"]


def run_python(script: str, world: int, checkpoint: Path) -> str:
    """The library starts the processes: `python SCRIPT --devices W`."""
    result = subprocess.run([sys.executable, script, "--devices", str(world), *EPOCHS,
                             "--checkpoint", str(checkpoint)], cwd=ROOT, capture_output=True,
                            text=True, timeout=240, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result.stdout


def run_torchrun(script: str, world: int, checkpoint: Path, more: tuple = ()) -> str:
    result = launch(script, [*EPOCHS, "--checkpoint", str(checkpoint), *more], nproc=world,
                    timeout=240, cwd=str(ROOT), capture=True, echo=False, backend="gloo")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result.stdout


@pytest.fixture(scope="module")
def ddp(tmp_path_factory):
    """Lesson 3's own runs, once per world size."""
    folder = tmp_path_factory.mktemp("ddp")
    runs = {}
    for world in (2, 3):
        run_torchrun("scripts/lesson3_ddp.py", world, folder / f"w{world}.pt")
        runs[world] = weights(folder / f"w{world}.pt")
    return runs


@pytest.mark.timeout(600)
@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("started_by", ["python", "torchrun"])
@pytest.mark.parametrize("script", ["scripts/lesson9_fabric.py", "scripts/lesson9_lightning.py"])
def test_the_library_trains_to_lesson_3_s_weights_bit_for_bit(ddp, tmp_path, script,
                                                               started_by, world):
    checkpoint = tmp_path / "final.pt"
    out = (run_python if started_by == "python" else run_torchrun)(script, world, checkpoint)
    assert f"{world} process(es) on cpu with gloo" in out
    reference, trained = ddp[world], weights(checkpoint)
    assert list(trained) == list(reference)  # the same model, its 92 tensors in order
    differing = [name for name in reference if not torch.equal(reference[name], trained[name])]
    assert differing == [], f"{len(differing)} tensors differ, e.g. {differing[:3]}"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [2, 3])
def test_accelerate_under_torchrun_trains_to_lesson_3_s_weights(ddp, tmp_path, world):
    pytest.importorskip("accelerate", reason="lesson 9's packages are not installed")
    run_torchrun("scripts/lesson9_accelerate.py", world, tmp_path / "final.pt")
    trained = weights(tmp_path / "final.pt")
    assert all(torch.equal(ddp[world][name], trained[name]) for name in ddp[world])


@pytest.mark.timeout(300)
def test_accelerate_s_own_loader_is_another_order_of_the_data(ddp, tmp_path):
    # Whole batches per rank from its own shuffle: the same training, another run.
    pytest.importorskip("accelerate", reason="lesson 9's packages are not installed")
    run_torchrun("scripts/lesson9_accelerate.py", 2, tmp_path / "final.pt",
                 ["--accelerate-loader"])
    trained = weights(tmp_path / "final.pt")
    differing = [name for name in ddp[2] if not torch.equal(ddp[2][name], trained[name])]
    assert len(differing) > len(ddp[2]) / 2


@pytest.mark.timeout(120)
def test_accelerate_without_gpus_refuses_to_train_each_process_alone(tmp_path):
    # Accelerator() without cpu=True on a machine without GPUs: every process alone. The
    # script passes cpu=True; a copy without it must stop with one line, not train.
    pytest.importorskip("accelerate", reason="lesson 9's packages are not installed")
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
@pytest.mark.parametrize("stage", [0, 1, 2])
def test_deepspeed_s_zero_stages_train_to_lesson_3_s_weights_at_w2(ddp, tmp_path, stage):
    pytest.importorskip("deepspeed", reason="lesson 9's packages are not installed")
    run_torchrun("scripts/lesson9_deepspeed.py", 2, tmp_path / "final.pt",
                 ["--zero-stage", str(stage)])
    trained = weights(tmp_path / "final.pt")
    assert all(torch.equal(ddp[2][name], trained[name]) for name in ddp[2])


@pytest.mark.timeout(300)
def test_deepspeed_at_w3_averages_in_another_order_close_but_not_the_same_bits(ddp, tmp_path):
    # Sum, then times 1/3 (the engine) against divide by 3, then sum (DDP): the last bit,
    # grown by two epochs of training into a visible but small difference.
    pytest.importorskip("deepspeed", reason="lesson 9's packages are not installed")
    run_torchrun("scripts/lesson9_deepspeed.py", 3, tmp_path / "final.pt")
    trained, reference = weights(tmp_path / "final.pt"), ddp[3]
    parameters = [name for name in reference if reference[name].is_floating_point()]
    gap = max((reference[n] - trained[n]).abs().max().item() for n in parameters)
    assert 0 < gap < 0.1, gap


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", [2, 3])
def test_lesson_3_on_dask_workers_trains_to_lesson_3_s_weights(ddp, tmp_path, world):
    pytest.importorskip("distributed", reason="lesson 9's packages are not installed")
    checkpoint = tmp_path / "final.pt"
    result = subprocess.run([sys.executable, "scripts/lesson9_dask.py", "--workers", str(world),
                             "--timeout", "240", "--", *EPOCHS, "--checkpoint", str(checkpoint)],
                            cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    pids = re.search(r"^Dask: the ranks ran in worker processes \[([\d, ]+)\]; this process, "
                     r"the client, is (\d+);", result.stdout, re.M)
    ranks, client = pids.group(1).split(", "), pids.group(2)
    assert len(set(ranks)) == world and client not in ranks  # W processes, none the root
    trained = weights(checkpoint)
    assert all(torch.equal(ddp[world][name], trained[name]) for name in ddp[world])


@pytest.mark.timeout(120)
def test_a_rank_that_stops_on_dask_ends_the_run_with_one_line():
    pytest.importorskip("distributed", reason="lesson 9's packages are not installed")
    result = subprocess.run([sys.executable, "scripts/lesson9_dask.py", "--workers", "3",
                             "--timeout", "60", "--", "--epochs", "-1"],
                            cwd=ROOT, capture_output=True, text=True, timeout=110)
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == "error: rank 0: lesson3_ddp.py stopped: 2"
