"""Lesson 2, step 1: train a timm model on one device. The baseline for every later script.

    make lesson2                                        # this script, then DataParallel
    python scripts/lesson2_single_device.py --epochs 8 --batch-size 256

The next scripts are this file plus the lines their lesson is about, and nothing else:
    diff scripts/lesson2_single_device.py scripts/lesson2_data_parallel.py
    diff scripts/lesson2_single_device.py scripts/lesson3_ddp.py
"""

import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from ddpcourse.cli import ArgumentParser
from ddpcourse.data import DATASETS, NUM_CLASSES, load_datasets
from ddpcourse.models import create_model
from ddpcourse.report import summary_line
from ddpcourse.runtime import pick_device

# The learning rate belongs to the GLOBAL batch: 0.1 for 256 samples per optimizer step.
# Linear scaling rule: change the global batch by a factor k and scale the rate by k too.
BASE_LR, BASE_BATCH = 0.1, 256


def parse_args():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", choices=DATASETS, default="digits")
    parser.add_argument("--data-dir", default="data", help="where cifar10 looks for its files")
    parser.add_argument("--image-size", type=int, default=None,
                        help="image side in pixels (default: 16 for digits, 32 for cifar10)")
    parser.add_argument("--model", default="test_resnet", help="a timm model name")
    parser.add_argument("--pretrained", action="store_true",
                        help="start from timm's pretrained weights (must be on this machine)")
    parser.add_argument("--epochs", type=int, default=8, help="0 measures start-up alone")
    parser.add_argument("--batch-size", type=int, default=256,
                        help="the global batch: samples per optimizer step, all devices together")
    parser.add_argument("--lr", type=float, default=None,
                        help=f"learning rate for the global batch (default {BASE_LR} x "
                             f"batch-size / {BASE_BATCH}: the linear scaling rule)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint", default=f"runs/{Path(__file__).stem}.pt")
    args = parser.parse_args()
    if args.epochs < 0 or args.batch_size < 1:
        parser.error("--epochs must be >= 0 and --batch-size >= 1")
    return args


@torch.no_grad()
def evaluate(model, loader, device):
    """[correct predictions, samples seen] over `loader`, as a tensor on `device`."""
    model.eval()
    counts = torch.zeros(2, dtype=torch.float64, device=device)  # summed on the device
    for images, labels in loader:
        images, labels = images.to(device), labels.to(device)
        counts[0] += (model(images).argmax(1) == labels).sum()
        counts[1] += len(labels)
    return counts


def main():
    args = parse_args()
    started = time.perf_counter()

    device, _ = pick_device()  # the first GPU if there is one, else the CPU
    if device.type == "cuda":
        torch.cuda.set_device(device)

    batch_size = args.batch_size  # one device takes the whole batch

    train_set, val_set = load_datasets(args.dataset, args.data_dir, args.image_size)
    train_loader = DataLoader(train_set, batch_size=batch_size, shuffle=True,
                              generator=torch.Generator().manual_seed(args.seed))
    val_loader = DataLoader(val_set, batch_size=batch_size)

    torch.manual_seed(args.seed)  # the same initial weights in every run
    model = create_model(args.model, NUM_CLASSES[args.dataset], args.pretrained).to(device)
    lr = args.lr if args.lr is not None else BASE_LR * args.batch_size / BASE_BATCH
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4)

    parameters = sum(p.numel() for p in model.parameters())
    print(f"{args.model} ({parameters / 1e6:.2f} M parameters) on {args.dataset}: "
          f"{len(train_set)} training and {len(val_set)} validation images, device {device}")
    print(f"global batch {args.batch_size} = 1 process x {batch_size}, lr {lr:g}")

    train_loss = val_acc = float("nan")
    train_seconds = trained = 0
    for epoch in range(args.epochs):
        model.train()
        tick = time.perf_counter()
        # Running sums stay on the device: .item() would make the CPU wait for the GPU at
        # every step. They are read once, when the epoch ends.
        stats = torch.zeros(3, dtype=torch.float64, device=device)  # loss sum, correct, seen
        for images, labels in train_loader:
            images, labels = images.to(device), labels.to(device)
            logits = model(images)
            loss = F.cross_entropy(logits, labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            stats[0] += loss.detach() * len(labels)  # detach: no graph across the epoch
            stats[1] += (logits.argmax(1) == labels).sum()
            stats[2] += len(labels)
        loss_sum, correct, seen = stats.tolist()  # the epoch's one wait for the device
        train_seconds += time.perf_counter() - tick
        trained += int(seen)

        counts = evaluate(model, val_loader, device)
        val_correct, val_seen = counts.tolist()
        train_loss, val_acc = loss_sum / seen, val_correct / val_seen
        print(f"epoch {epoch + 1}/{args.epochs}  loss {train_loss:.4f}  "
              f"train acc {correct / seen:.3f}  val acc {val_acc:.3f} "
              f"({int(val_seen)} images)  {time.perf_counter() - tick:.1f} s")

    os.makedirs(os.path.dirname(args.checkpoint) or ".", exist_ok=True)
    torch.save({"model": model.state_dict(), "args": vars(args)}, args.checkpoint)
    print(f"checkpoint: {args.checkpoint}")
    print(summary_line(world_size=1, batch_per_process=batch_size,
                       global_batch=args.batch_size, epochs=args.epochs,
                       train_loss=train_loss, val_acc=val_acc,
                       samples_per_s=round(trained / max(train_seconds, 1e-9)),
                       wall_s=round(time.perf_counter() - started, 2)))


if __name__ == "__main__":
    main()
