"""Lesson 9: lesson 3's DDP training with Lightning's Trainer: the loop moves into the Trainer.

    python scripts/lesson9_lightning.py --devices 2     # Lightning starts the other processes
    torchrun --nproc-per-node=2 scripts/lesson9_lightning.py   # or torchrun does, and it sees it

The Trainer does what lesson 3 wrote by hand: it starts the processes (running this script
again, once per extra device, with LOCAL_RANK set) or finds torchrun's, calls
init_process_group, wraps the model in DDP, calls sampler.set_epoch, runs the loop:
training_step, zero_grad, backward, step (lesson 3's order). The script keeps its model,
loss, optimizer and sampler; lesson 3's loop body is training_step, and what it did when an
epoch ended, on_train_epoch_end.
"""

import os
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler, Subset

from ddpcourse.cli import ArgumentParser, split_batch
from ddpcourse.data import DATASETS, NUM_CLASSES, load_datasets
from ddpcourse.models import create_model
from ddpcourse.report import summary_line
from ddpcourse.runtime import fail, needs_library

needs_library("lightning", "make setup-lesson9")  # before importing it: one line, not a traceback
import lightning as L
from lightning.pytorch.strategies import DDPStrategy

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
    parser.add_argument("--batch-size", type=int, default=None,
                        help=f"the global batch, all devices together (default {BASE_BATCH}, "
                             "rounded down to split over the processes)")
    parser.add_argument("--lr", type=float, default=None,
                        help=f"learning rate for the global batch (default {BASE_LR} x "
                             f"batch-size / {BASE_BATCH}: the linear scaling rule)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--devices", type=int, default=1,
                        help="processes Lightning starts on this machine (under torchrun: its own)")
    parser.add_argument("--checkpoint", default=f"runs/{Path(__file__).stem}.pt")
    parser.add_argument("--timeout", type=float, default=120,
                        help="seconds a collective may wait for the other processes")
    args = parser.parse_args()
    if args.epochs < 0 or args.batch_size is not None and args.batch_size < 1 \
            or args.devices < 1:
        parser.error("--epochs must be >= 0, --batch-size and --devices >= 1")
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


class Lesson3(L.LightningModule):
    """Lesson 3's model, data, loss and optimizer; its loop body as training_step, and what
    it did when an epoch ended as on_train_epoch_end. The Trainer calls them, in every
    process, once the processes exist."""

    def __init__(self, model, args, batch_size, rounded):
        super().__init__()
        self.model, self.args, self.batch_size, self.rounded = model, args, batch_size, rounded
        self.train_loss = self.val_acc = float("nan")
        self.train_seconds = self.trained = 0

    def setup(self, stage):  # the processes are started and the group made: ranks known
        args, rank, world_size = self.args, self.global_rank, self.trainer.world_size
        rounded = self.rounded
        train_set, val_set = load_datasets(args.dataset, args.data_dir, args.image_size)
        # Each process reads its own 1/world_size of the shuffled training set; the Trainer
        # calls set_epoch. Ours, given: use_distributed_sampler=False keeps it.
        sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank,
                                     shuffle=True, seed=args.seed)
        self.train_loader = DataLoader(train_set, batch_size=self.batch_size, sampler=sampler)
        # Validation: every world_size-th image, no sampler padding: each one counted once.
        self.val_loader = DataLoader(Subset(val_set, range(rank, len(val_set), world_size)),
                                     batch_size=self.batch_size)
        self.lr = args.lr if args.lr is not None else BASE_LR * args.batch_size / BASE_BATCH
        parameters = sum(p.numel() for p in self.model.parameters())
        if rank == 0:  # rank 0 speaks for the job
            print(f"{args.model} ({parameters / 1e6:.2f} M parameters) on {args.dataset}: "
                  f"{len(train_set)} training and {len(val_set)} validation images, "
                  f"{world_size} process(es) on {self.device.type} with {dist.get_backend()}")
            print(f"global batch {args.batch_size} = {world_size} process(es) x "
                  f"{self.batch_size}, lr {self.lr:g}{rounded}")

    def train_dataloader(self):
        return self.train_loader

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9, weight_decay=5e-4)

    def on_train_epoch_start(self):
        self.tick = time.perf_counter()
        # Running sums stay on the device: .item() would make the CPU wait for the GPU at
        # every step. They are read once, when the epoch ends.
        self.stats = torch.zeros(3, dtype=torch.float64, device=self.device)

    def training_step(self, batch, batch_idx):  # the Trainer moved the batch to the device
        images, labels = batch
        logits = self.model(images)
        loss = F.cross_entropy(logits, labels)
        self.stats[0] += loss.detach() * len(labels)  # detach: no graph across the epoch
        self.stats[1] += (logits.argmax(1) == labels).sum()
        self.stats[2] += len(labels)
        return loss  # the Trainer calls backward() and the optimizer's step()

    def on_train_epoch_end(self):
        stats = self.stats
        dist.all_reduce(stats)  # sums over ranks: the loss and accuracy of the whole epoch
        loss_sum, correct, seen = stats.tolist()  # the epoch's one wait for the device
        self.train_seconds += time.perf_counter() - self.tick
        self.trained += int(seen)

        # Each rank's batches moved its own BatchNorm statistics: use rank 0's, as saved.
        for buffer in self.model.buffers():
            dist.broadcast(buffer, src=0)
        # The plain model: its forward does no collectives, so shard sizes may differ.
        counts = evaluate(self.model, self.val_loader, self.device)
        self.model.train()  # the Trainer never sets train mode in fit (it only warns at the start)
        dist.all_reduce(counts)  # correct and seen, summed over the ranks' shards
        val_correct, val_seen = counts.tolist()
        self.train_loss, self.val_acc = loss_sum / seen, val_correct / val_seen
        if self.global_rank == 0:
            print(f"epoch {self.current_epoch + 1}/{self.args.epochs}  loss "
                  f"{self.train_loss:.4f}  train acc {correct / seen:.3f}  val acc "
                  f"{self.val_acc:.3f} ({int(val_seen)} images)  "
                  f"{time.perf_counter() - self.tick:.1f} s")


def main():
    args = parse_args()
    started = time.perf_counter()

    # Under torchrun the Trainer takes its processes; else fit() starts --devices - 1 more,
    # each running this script again from the top (LOCAL_RANK set), as torchrun would.
    launched = "LOCAL_WORLD_SIZE" in os.environ
    devices = int(os.environ["LOCAL_WORLD_SIZE"]) if launched else args.devices
    nodes = int(os.environ["WORLD_SIZE"]) // devices if launched else 1
    trainer = L.Trainer(accelerator="auto", devices=devices, num_nodes=nodes,
                        strategy=DDPStrategy(timeout=timedelta(seconds=args.timeout)),
                        max_epochs=args.epochs, use_distributed_sampler=False, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)

    # The global batch stays what it was on one device; each process takes an equal share.
    # Left out, it is 256 rounded down to split (255 = 3 x 85); given, it must split exactly.
    # Checked before fit() starts the other processes, which nothing would stop after.
    try:  # args.batch_size becomes the global batch this run really trains with
        args.batch_size, batch_size, rounded = split_batch(args.batch_size, BASE_BATCH,
                                                           trainer.world_size)
    except ValueError as mistake:  # every rank meets it: rank 0 says so, the others wait
        fail(str(mistake))

    torch.manual_seed(args.seed)  # the same initial weights in every run
    model = create_model(args.model, NUM_CLASSES[args.dataset], args.pretrained)
    module = Lesson3(model, args, batch_size, rounded)
    # Starts the processes, calls init_process_group (gloo on CPUs, nccl on GPUs), moves the
    # model to the device, wraps it in DDP (which copies rank 0's weights everywhere, then
    # averages gradients during backward), and runs the epochs.
    trainer.fit(module)

    if trainer.global_rank == 0:  # one checkpoint, written once: every rank holds the same
        os.makedirs(os.path.dirname(args.checkpoint) or ".", exist_ok=True)
        torch.save({"model": model.state_dict(), "args": vars(args)}, args.checkpoint)
        print(f"checkpoint: {args.checkpoint}")
        print(summary_line(world_size=trainer.world_size, batch_per_process=module.batch_size,
                           global_batch=args.batch_size, epochs=args.epochs,
                           train_loss=module.train_loss, val_acc=module.val_acc,
                           samples_per_s=round(module.trained / max(module.train_seconds, 1e-9)),
                           wall_s=round(time.perf_counter() - started, 2)))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
