"""Lesson 2: the single-device baseline and DataParallel learn, and DataParallel on a CPU is
the single-device run; the data and model helpers fail with one line, never a download."""

import os
import subprocess

import pytest
from util import PYTHON, ROOT, run, summary


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_single_device_and_data_parallel_learn_the_same_way(tmp_path):
    """Both scripts at once (one thread each): on a CPU DataParallel is a pass-through, so
    its run is the single-device run, number for number."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = {name: subprocess.Popen(
        [PYTHON, f"scripts/lesson2_{name}.py", "--checkpoint", str(tmp_path / f"{name}.pt")],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for name in ("single_device", "data_parallel")}
    outputs = {name: p.communicate(timeout=170) for name, p in procs.items()}
    for name, p in procs.items():
        assert p.returncode == 0, outputs[name]
    single, _ = outputs["single_device"]
    parallel, _ = outputs["data_parallel"]
    s, d = summary(single), summary(parallel)
    assert set(s) == set(d) >= {"world_size", "batch_per_process", "global_batch", "epochs",
                                "train_loss", "val_acc", "samples_per_s", "wall_s"}
    assert s["world_size"] == "1" and s["global_batch"] == s["batch_per_process"] == "256"
    assert float(s["val_acc"]) > 0.8  # chance is 0.1
    assert float(s["train_loss"]) < 0.1
    assert "DataParallel: no GPU, so device_ids == []" in parallel
    assert "DataParallel" not in single
    for key in ("train_loss", "val_acc"):
        assert s[key] == d[key], key
    epochs = [line for line in single.splitlines() if line.startswith("epoch ")]
    assert len(epochs) == 8 and all("(359 images)" in line for line in epochs)
    assert (tmp_path / "single_device.pt").stat().st_size > 100_000
    assert (tmp_path / "data_parallel.pt").stat().st_size > 100_000


def test_digits_are_offline_fixed_and_shaped_for_timm():
    import torch

    from ddpcourse.data import load_datasets

    train, val = load_datasets("digits")
    assert (len(train), len(val)) == (1438, 359)
    images, labels = train.tensors
    assert images.shape[1:] == (3, 16, 16) and images.dtype.is_floating_point
    assert abs(images.mean().item()) < 1e-3 and abs(images.std().item() - 1) < 1e-2
    assert sorted(set(labels.tolist())) == list(range(10))
    again, _ = load_datasets("digits")
    assert again.tensors[1].tolist() == labels.tolist()  # the same split every time
    big, _ = load_datasets("digits", image_size=32)
    assert big.tensors[0].shape[1:] == (3, 32, 32)
    everything = torch.cat([labels, val.tensors[1]])  # the class counts of load_digits()
    assert torch.bincount(everything).tolist() == [178, 182, 177, 183, 181, 182, 181, 179,
                                                   174, 180]


def one_line_exit(call, capsys) -> str:
    with pytest.raises(SystemExit) as stop:
        call()
    assert stop.value.code == 1
    message = capsys.readouterr().err
    assert message.startswith("error: ") and message.count("\n") == 1, message
    return message.rstrip("\n")


@pytest.mark.slow
def test_missing_cifar10_unknown_model_and_bad_size_are_one_line_errors(tmp_path, capsys):
    from ddpcourse.data import load_datasets
    from ddpcourse.models import create_model

    message = one_line_exit(lambda: load_datasets("cifar10", str(tmp_path)), capsys)
    assert str(tmp_path) in message and "cifar-10-batches-py" in message
    assert not list(tmp_path.iterdir())  # nothing was downloaded
    assert "no model called 'resnet_9000'" in one_line_exit(
        lambda: create_model("resnet_9000", 10), capsys)
    assert "--image-size 4" in one_line_exit(lambda: load_datasets("digits", image_size=4),
                                              capsys)


def test_pretrained_weights_come_from_the_local_cache(tmp_path, monkeypatch):
    """A weights file in the Hugging Face cache layout is loaded without any network call."""
    import timm
    import torch
    from safetensors.torch import save_file

    from ddpcourse.models import create_model

    cache = tmp_path / "hub"
    snapshot = cache / "models--timm--test_resnet.r160_in1k" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (cache / "models--timm--test_resnet.r160_in1k" / "refs").mkdir()
    (cache / "models--timm--test_resnet.r160_in1k" / "refs" / "main").write_text("abc123")
    torch.manual_seed(1)
    weights = timm.create_model("test_resnet").state_dict()
    save_file(weights, str(snapshot / "model.safetensors"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as hub

    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(cache))
    model = create_model("test_resnet", num_classes=10, pretrained=True)
    assert torch.equal(model.conv1[0].weight, weights["conv1.0.weight"])
    assert model.get_classifier().out_features == 10  # the 1000-class head is replaced


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_pretrained_without_weights_or_network_is_one_line(tmp_path):
    result = run([PYTHON, "scripts/lesson2_single_device.py", "--pretrained",
                  "--checkpoint", str(tmp_path / "x.pt")],
                 env={"HF_HOME": str(tmp_path / "hf"), "HF_HUB_CACHE": str(tmp_path / "hf"),
                      "HF_HUB_OFFLINE": "1", "TORCH_HOME": str(tmp_path / "torch")},
                 timeout=80)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "error: no pretrained weights for test_resnet on this machine, and huggingface.co "
        "cannot be reached to fetch them; run without --pretrained (the lessons train from "
        "scratch), or fetch them once where there is a network"]
    assert not (tmp_path / "x.pt").exists()
