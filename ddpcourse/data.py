"""The lessons' datasets, as in-memory datasets of (image, label) pairs that need no download.

digits (the default): scikit-learn's 1797 handwritten digits, 8x8 gray images of 0-9 that
ship inside the scikit-learn package. They are scaled up to 16x16 (quick on a CPU; use
image_size=32 for a model that needs more) and copied into 3 channels, so that any timm
model takes them as it takes photographs. A fixed split keeps 1438 images for training and
359 for validation: a fifth, and a prime number, so no world size above one divides it.

cifar10 (an option): torchvision's CIFAR-10, read from --data-dir when its files are there
(download=False: nothing is fetched at run time), 50000 training and 10000 test images.
"""

from __future__ import annotations

import importlib.util
import os

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset, TensorDataset

from ddpcourse.runtime import fail

DATASETS = ("digits", "cifar10")
NUM_CLASSES = {"digits": 10, "cifar10": 10}
NATIVE_SIZE = {"digits": 16, "cifar10": 32}
DIGITS_VALIDATION = 359  # images held out for validation; the same ones in every run
SPLIT_SEED = 1234  # fixes which images are held out, independently of the training seed

CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)


def load_datasets(name: str = "digits", data_dir: str | None = None,
                  image_size: int | None = None) -> tuple[Dataset, Dataset]:
    """(training set, validation set) of `name`; images are float [3, S, S], labels int64.

    `image_size` S defaults to the dataset's own (16 for digits, 32 for cifar10).
    Problems (an unknown name, missing files, a silly size) stop the program with one line.
    """
    if name not in DATASETS:
        fail(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")
    size = NATIVE_SIZE[name] if image_size is None else image_size
    if not 8 <= size <= 512:
        fail(f"--image-size {size} is out of range; use a size between 8 and 512")
    if name == "digits":
        return _digits(size)
    return _cifar10(data_dir or "data", size)


def digits_table():
    """The 1797 x 65 table behind sklearn.datasets.load_digits (64 pixels, then the label).

    Reading the file directly skips importing scikit-learn, which would cost every process of
    a job more than a second; load_digits() is the fallback and returns the same numbers.
    """
    import numpy as np

    spec = importlib.util.find_spec("sklearn")
    if spec and spec.submodule_search_locations:
        path = os.path.join(spec.submodule_search_locations[0], "datasets", "data",
                            "digits.csv.gz")
        if os.path.exists(path):
            return np.loadtxt(path, delimiter=",", dtype=np.float32)
    from sklearn.datasets import load_digits

    digits = load_digits()
    return np.column_stack([digits.data, digits.target]).astype(np.float32)


def _digits(size: int) -> tuple[TensorDataset, TensorDataset]:
    table = torch.from_numpy(digits_table())
    images = table[:, :-1].reshape(-1, 1, 8, 8) / 16.0  # pixel values are 0..16
    labels = table[:, -1].long()
    images = F.interpolate(images, size=(size, size), mode="bilinear", align_corners=False)
    images = images.expand(-1, 3, -1, -1)
    order = torch.randperm(len(images), generator=torch.Generator().manual_seed(SPLIT_SEED))
    val, train = order[:DIGITS_VALIDATION], order[DIGITS_VALIDATION:]
    mean, std = images[train].mean(), images[train].std()  # from the training images only
    images = ((images - mean) / std).contiguous()
    return TensorDataset(images[train], labels[train]), TensorDataset(images[val], labels[val])


class ImageTensors(Dataset):
    """uint8 images [N, H, W, 3] kept compact in memory, normalised one at a time when read."""

    def __init__(self, images, labels, mean, std, size: int):
        self.images = torch.as_tensor(images)
        self.labels = torch.as_tensor(labels, dtype=torch.long)
        self.mean = torch.tensor(mean).view(3, 1, 1)
        self.std = torch.tensor(std).view(3, 1, 1)
        self.size = size

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index):
        image = self.images[index].permute(2, 0, 1).float() / 255.0
        if image.shape[-1] != self.size:
            image = F.interpolate(image[None], size=(self.size, self.size), mode="bilinear",
                                  align_corners=False)[0]
        return (image - self.mean) / self.std, self.labels[index]


def _cifar10(data_dir: str, size: int) -> tuple[ImageTensors, ImageTensors]:
    from torchvision.datasets import CIFAR10

    try:
        train = CIFAR10(data_dir, train=True, download=False)
        test = CIFAR10(data_dir, train=False, download=False)
    except RuntimeError:
        fail(f"CIFAR-10 is not in {os.path.abspath(data_dir)} (expected its "
             "cifar-10-batches-py folder there); put it there, or pass --data-dir, or use the "
             "default --dataset digits, which needs no files")
    return (ImageTensors(train.data, train.targets, CIFAR10_MEAN, CIFAR10_STD, size),
            ImageTensors(test.data, test.targets, CIFAR10_MEAN, CIFAR10_STD, size))
