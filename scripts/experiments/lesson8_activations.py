"""Lesson 8 experiment: activation memory against batch and sequence, then checkpointing.

    make lesson8-activations                    # prints, then runs, this command:
    python scripts/experiments/lesson8_activations.py

Lesson 8 counts weights, gradients and optimizer state; a job usually runs out of memory on
activations, the tensors forward keeps for backward. This experiment counts them for a small
decoder of lesson8_scale.py's design: every tensor autograd saves during forward passes
through a saved_tensors_hooks pack function, which adds up the bytes of the distinct
storages (the weights, saved by every linear layer, left out). First against the batch size
and the sequence length; then with every block under torch.utils.checkpoint, which keeps a
block's input and recomputes the rest in backward: the bytes saved, against the time added,
in one run, and the gradients compared with the plain run's. Last, the same under FSDP2
(fully_shard per block, rank 0 of W in this process with the fake backend, as in
lesson8_scale.py): the same activations are kept, and checkpointing saves the same share.
"""

import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from ddpcourse.cli import ArgumentParser
from ddpcourse.report import format_table, summary_line
from ddpcourse.scripts import import_script

Decoder = import_script("experiments/lesson8_scale", "Decoder")  # the scale experiment's decoder


def parse_args():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=512, help="model width (heads of 64)")
    parser.add_argument("--batches", default="1,2,4,8", help="batch sizes to count")
    parser.add_argument("--lengths", default="64,128,256", help="sequence lengths to count")
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per setting")
    parser.add_argument("--world-size", type=int, default=8,
                        help="FSDP2's ranks in the last part (this process is rank 0)")
    args = parser.parse_args()
    try:
        args.batches = [int(b) for b in args.batches.split(",")]
        args.lengths = [int(s) for s in args.lengths.split(",")]
    except ValueError:
        parser.error("--batches and --lengths take whole numbers separated by commas")
    if min(args.batches + args.lengths) < 1 or args.layers < 1 or args.width < 64 \
            or args.width % 64 or args.repeats < 1 or args.world_size < 1:
        parser.error("sizes must be at least 1, --width a multiple of 64")
    return args


def forward(model, tokens, checkpointed: bool):
    """The decoder's forward, each block under torch.utils.checkpoint if asked."""
    model.checkpointed = checkpointed
    return model(tokens)


def saved_bytes(model, tokens, checkpointed: bool) -> tuple[int, torch.Tensor]:
    """Bytes autograd keeps for backward during one forward (weights left out), and the
    loss, its graph alive."""
    seen = {}

    def pack(tensor):
        # The model's weights as they are now: under FSDP2, during a unit's forward, the
        # gathered whole ones (it frees them after forward itself); else the shards' locals.
        weights = {(p.to_local() if hasattr(p, "to_local") else p).untyped_storage().data_ptr()
                   for p in model.parameters()}
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in weights:
            seen[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        logits = forward(model, tokens, checkpointed)
    loss = F.cross_entropy(logits.flatten(0, 1), tokens.flatten())
    return sum(seen.values()), loss


def step_ms(model, tokens, checkpointed: bool, repeats: int) -> float:
    """Median milliseconds of forward + backward."""
    times = []
    for _ in range(repeats + 1):  # the first warms up
        model.zero_grad(set_to_none=True)
        tick = time.perf_counter()
        logits = forward(model, tokens, checkpointed)
        F.cross_entropy(logits.flatten(0, 1), tokens.flatten()).backward()
        times.append((time.perf_counter() - tick) * 1e3)
    return statistics.median(times[1:])


def compare_checkpointing(model, tokens, repeats, compare_grads=True):
    """{False: (saved bytes, gradients, ms), True: (...)}: the model's blocks kept whole, then
    checkpointed, in one run."""
    results = {}
    for checkpointed in (False, True):
        saved, loss = saved_bytes(model, tokens, checkpointed)
        model.zero_grad(set_to_none=True)
        loss.backward()
        grads = [p.grad.clone() for p in model.parameters()] if compare_grads else []
        results[checkpointed] = (saved, grads, step_ms(model, tokens, checkpointed, repeats))
    return results


def gradient_gap(results) -> float:
    return max((a - b).abs().max().item()
               for a, b in zip(results[False][1], results[True][1], strict=True))


def sharded(model, world_size):
    """The model under FSDP2, one unit per block, as rank 0 of `world_size` (fake backend)."""
    dist.init_process_group("fake", rank=0, world_size=world_size, store=dist.HashStore())
    mesh = init_device_mesh("cpu", (world_size,), backend_override={0: "fake"})
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def main():
    args = parse_args()
    started = time.perf_counter()
    torch.manual_seed(0)
    vocab = 1000
    model = Decoder(args.layers, args.width, int(args.width * 2.6875) // 64 * 64, vocab,
                    args.width // 64)
    count = sum(p.numel() for p in model.parameters())
    print(f"decoder: {args.layers} blocks of width {args.width}, {count / 1e6:.2f} M parameters "
          f"({count * 4 / 1e6:.1f} MB of fp32 weights), fp32, on the CPU")

    rows = []
    for length in args.lengths:
        for batch in args.batches:
            tokens = torch.randint(vocab, (batch, length))
            plain, _ = saved_bytes(model, tokens, checkpointed=False)
            rows.append({"batch": batch, "tokens": length, "saved MB": f"{plain / 1e6:.2f}",
                         "KB per token": f"{plain / 1e3 / (batch * length):.1f}"})
    print("activations kept for backward, by batch and sequence length:")
    print(format_table(rows))

    batch, length = args.batches[-1], args.lengths[-1]
    tokens = torch.randint(vocab, (batch, length))
    results = compare_checkpointing(model, tokens, args.repeats)
    (plain, _, plain_ms), (kept, _, ckpt_ms) = results[False], results[True]
    gap = gradient_gap(results)
    print(f"every block checkpointed, batch {batch} x {length} tokens:")
    print(format_table([{"blocks": name, "saved MB": f"{saved / 1e6:.2f}", "ms per step":
                         f"{ms:.0f}"} for name, saved, ms in [("kept whole", plain, plain_ms),
                                                              ("checkpointed", kept, ckpt_ms)]]))
    print(f"checkpointing keeps {kept / plain:.2f} of the activations and takes "
          f"{ckpt_ms / plain_ms:.2f}x the time (forward runs twice per block); the gradients "
          f"differ by at most {gap:.1e}")

    # The same model and tokens under FSDP2: a rank keeps the same activations (each holds the
    # whole batch of its own data; only the weights are sharded), so checkpointing saves the
    # same share; the recomputed forward all-gathers each block's weights again.
    model = sharded(model, args.world_size)
    fsdp = compare_checkpointing(model, tokens, args.repeats, compare_grads=False)
    (fsdp_plain, _, fsdp_plain_ms), (fsdp_kept, _, fsdp_ckpt_ms) = fsdp[False], fsdp[True]
    dist.destroy_process_group()
    print(f"the same under FSDP2, rank 0 of {args.world_size} (fake backend):")
    print(format_table([{"blocks": name, "saved MB": f"{saved / 1e6:.2f}", "ms per step":
                         f"{ms:.0f}"} for name, saved, ms in [
                             ("kept whole", fsdp_plain, fsdp_plain_ms),
                             ("checkpointed", fsdp_kept, fsdp_ckpt_ms)]]))
    print(f"under FSDP2 checkpointing keeps {fsdp_kept / fsdp_plain:.2f} of the activations and "
          f"takes {fsdp_ckpt_ms / fsdp_plain_ms:.2f}x the time (the fake reduce-scatter leaves "
          "the gradient shards as it found them: they are not compared)")
    print(summary_line(layers=args.layers, width=args.width, batch=batch, tokens=length,
                       activation_mb=round(plain / 1e6, 2), checkpointed_mb=round(kept / 1e6, 2),
                       memory_ratio=round(kept / plain, 3), time_ratio=round(ckpt_ms / plain_ms, 2),
                       grad_diff=f"{gap:.1e}", fsdp_activation_mb=round(fsdp_plain / 1e6, 2),
                       fsdp_memory_ratio=round(fsdp_kept / fsdp_plain, 3),
                       fsdp_time_ratio=round(fsdp_ckpt_ms / fsdp_plain_ms, 2),
                       wall_s=round(time.perf_counter() - started, 1)))


if __name__ == "__main__":
    main()
