"""Lesson 8 experiment: a pipeline's bubble, measured and drawn, for GPipe and 1F1B.

    make lesson8-bubble NPROC=2                     # prints, then runs, this command:
    torchrun --nproc-per-node=2 scripts/experiments/lesson8_pipeline_bubble.py

scripts/lesson8_pipeline.py trains lesson 3's model as a pipeline. Its stages are unequal (a
ResNet's children), so the bubble there is more than the formula's. Here every stage is the
same: B equal Linear + ReLU blocks shared out over the S = W processes, so that while the
pipeline fills and drains the waiting is (S - 1) / (M + S - 1) of the step, M micro-batches.
Each micro-batch's forward and backward is timed on every stage; the bubble is the idle share
of the step; the timeline is drawn; the messages are counted; and rank 0 then trains the
unsplit model from the same start on the same batches: the losses must agree.
"""

import json
import os
import time
from datetime import timedelta

os.environ.setdefault("MPLBACKEND", "Agg")  # draw to a file; no screen needed

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.utils.data import DataLoader

from ddpcourse.cli import ArgumentParser
from ddpcourse.data import NUM_CLASSES, load_datasets
from ddpcourse.report import format_table, summary_line
from ddpcourse.runtime import (
    end_with_rank_0s_verdict,
    fail,
    pick_device,
    world_of_one_unless_launched,
)

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


def parse_args():
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--micro-batches", default="8",
                        help="M, or several separated by commas (e.g. 2,4,8,16): one run each")
    parser.add_argument("--schedules", default="gpipe,1f1b",
                        help=f"which, separated by commas: {', '.join(SCHEDULES)}")
    parser.add_argument("--steps", type=int, default=4,
                        help="SGD steps of each run; the first is a warm-up, not timed")
    parser.add_argument("--batch-size", type=int, default=256, help="samples per step")
    parser.add_argument("--blocks", type=int, default=16,
                        help="Linear + ReLU blocks of the model, shared out over the stages")
    parser.add_argument("--width", type=int, default=None,
                        help="features of every block (default: the image's 768 values, so "
                             "that every block, the first included, costs the same)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tolerance", type=float, default=1e-5,
                        help="largest relative loss difference that counts as the same")
    parser.add_argument("--events", default="runs/lesson8_pipeline_events.json",
                        help="where rank 0 writes every timed forward and backward")
    parser.add_argument("--picture", default="runs/lesson8_pipeline_timeline.png",
                        help="where rank 0 draws the last step of each schedule")
    parser.add_argument("--timeout", type=float, default=120,
                        help="seconds a collective may wait for the other processes")
    args = parser.parse_args()
    try:
        args.micro_batches = [int(m) for m in args.micro_batches.split(",")]
    except ValueError:
        parser.error(f"--micro-batches {args.micro_batches!r}: give whole numbers, e.g. 4,8")
    args.schedules = args.schedules.split(",")
    if any(s not in SCHEDULES for s in args.schedules):
        parser.error(f"--schedules: choose from {', '.join(SCHEDULES)}")
    if min(args.micro_batches) < 1 or args.steps < 2 or args.blocks < 1 or (args.width or 1) < 1:
        parser.error("--micro-batches, --blocks and --width must be at least 1, --steps 2")
    if any(args.batch_size % m for m in args.micro_batches):
        parser.error(f"--batch-size {args.batch_size} must split into equal micro-batches: "
                     f"a multiple of each of {args.micro_batches}")
    return args


def layers(blocks: int, width: int, in_features: int, num_classes: int) -> list[nn.Module]:
    """Equal blocks (so the stages take equal time), the first flattening the images."""
    first = nn.Sequential(nn.Flatten(), nn.Linear(in_features, width), nn.ReLU())
    rest = [nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(blocks - 1)]
    return [first, *rest, nn.Linear(width, num_classes)]  # the head goes with the last stage


def stage_of(layer_list: list[nn.Module], stage: int, stages: int) -> nn.Sequential:
    """Stage `stage` of `stages`: consecutive blocks, the head with the last one."""
    blocks, head = layer_list[:-1], layer_list[-1]
    cuts = [round(i * len(blocks) / stages) for i in range(stages + 1)]
    mine = blocks[cuts[stage]:cuts[stage + 1]]
    return nn.Sequential(*mine, *([head] if stage == stages - 1 else []))


def timed(method, kind: str, events: list, sync):
    """`method` (a stage's forward_one_chunk or backward_one_chunk), recording each call;
    `sync` waits for the device to finish (a GPU runs the work after the call returns)."""
    def run(chunk, *args, **kwargs):
        sync()
        start = time.perf_counter()
        result = method(chunk, *args, **kwargs)
        sync()
        events.append((kind, chunk, start, time.perf_counter()))
        return result
    return run


def counted(method, sent: list):
    """`method` (a stage's get_fwd_send_ops or get_bwd_send_ops), noting the size of every
    message it asks for."""
    def run(*args, **kwargs):
        ops = method(*args, **kwargs)
        sent.extend(op.tensor.numel() for op in ops)
        return ops
    return run


def held_at_most(events: list) -> int:
    """The most micro-batches whose activations this stage kept at once (forward done,
    backward not yet)."""
    held = most = 0
    for kind, *_ in sorted(events, key=lambda e: e[2]):
        held += 1 if kind == "F" else -1
        most = max(most, held)
    return most


def main():
    args = parse_args()
    started = time.perf_counter()
    world_of_one_unless_launched()
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    stages = world_size  # pipeline parallelism only: every rank is one stage
    if "1f1b" in args.schedules and min(args.micro_batches) < stages:
        fail(f"Schedule1F1B needs at least as many micro-batches as stages ({stages}); "
             f"raise --micro-batches or use --schedules gpipe")
    if args.blocks < stages:
        fail(f"--blocks {args.blocks} cannot give each of {stages} stages a block")
    device, backend = pick_device(local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, timeout=timedelta(seconds=args.timeout))

    train_set, _ = load_datasets("digits")
    in_features = train_set[0][0].numel()
    args.width = args.width or in_features
    # No data parallelism: every stage walks the same batches (the first uses the images,
    # the last the labels), in the same shuffled order.
    loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True, drop_last=True,
                        generator=torch.Generator().manual_seed(args.seed))
    batches = [b for _, b in zip(range(args.steps), loader, strict=False)]
    if len(batches) < args.steps:
        fail(f"--steps {args.steps} needs more batches than one epoch has ({len(loader)})")
    lr = 0.05

    if rank == 0:
        print(f"{stages} stage(s), one per process, on {device.type} with {backend}; "
              f"{args.blocks} blocks of {args.width} features; batch {args.batch_size}, "
              f"micro-batches {', '.join(map(str, args.micro_batches))}")

    runs, rows = [], []
    for name in args.schedules:
        for micro in args.micro_batches:
            torch.manual_seed(args.seed)  # the same initial weights in every run
            model_layers = layers(args.blocks, args.width, in_features, NUM_CLASSES["digits"])
            stage_module = stage_of(model_layers, rank, stages).to(device)
            stage = PipelineStage(stage_module, rank, stages, device)
            # Wrapping pipelining's internals: the only way to time each micro-batch, per stage.
            events: list = []  # (F or B, micro-batch, start, end), this rank's
            sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
            stage.forward_one_chunk = timed(stage.forward_one_chunk, "F", events, sync)
            stage.backward_one_chunk = timed(stage.backward_one_chunk, "B", events, sync)
            sent: list = []  # the values in each message this rank sends
            stage.get_fwd_send_ops = counted(stage.get_fwd_send_ops, sent)
            stage.get_bwd_send_ops = counted(stage.get_bwd_send_ops, sent)
            schedule = SCHEDULES[name](stage, n_microbatches=micro, loss_fn=F.cross_entropy)
            optimizer = torch.optim.SGD(stage_module.parameters(), lr=lr)

            losses, steps = [], []
            for images, labels in batches:
                images, labels = images.to(device), labels.to(device)
                events.clear()
                sent.clear()
                dist.barrier()  # the stages start the step together: one clock for all
                t0 = time.perf_counter()
                micro_losses = []
                optimizer.zero_grad(set_to_none=True)
                if rank == 0 and stages == 1:
                    schedule.step(images, target=labels, losses=micro_losses)
                elif rank == 0:
                    schedule.step(images)                    # sends activations on
                elif rank == stages - 1:
                    schedule.step(target=labels, losses=micro_losses)
                else:
                    schedule.step()                          # receives, runs, sends on
                span = time.perf_counter() - t0
                optimizer.step()  # each stage steps its own parameters
                steps.append({"span": span, "events": [(k, c, s - t0, e - t0)
                                                       for k, c, s, e in events],
                              "sent": list(sent)})
                if micro_losses:
                    losses.append(torch.stack(micro_losses).mean().item())
            every = [None] * world_size if rank == 0 else None
            dist.gather_object({"steps": steps, "losses": losses,
                                "weights": {k: v.cpu() for k, v in
                                            stage_module.state_dict().items()}}, every, dst=0)
            if rank == 0:
                runs.append({"schedule": name, "micro_batches": micro, "stages": every})

    if rank == 0:
        # The unsplit model, from the same start, on the same batches, in one process.
        torch.manual_seed(args.seed)
        whole = nn.Sequential(*layers(args.blocks, args.width, in_features,
                                      NUM_CLASSES["digits"])).to(device)
        optimizer = torch.optim.SGD(whole.parameters(), lr=lr)
        reference = []
        for images, labels in batches:
            loss = F.cross_entropy(whole(images.to(device)), labels.to(device))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            reference.append(loss.item())
        whole_weights = [p.detach().cpu() for p in whole.parameters()]

        same = True
        for run in runs:
            s_count, micro = len(run["stages"]), run["micro_batches"]
            losses = run["stages"][-1]["losses"]
            loss_diff = max(abs(a - b) / abs(b) for a, b in zip(losses, reference, strict=True))
            piped = [w for st in run["stages"] for w in st["weights"].values()]
            weight_diff = max((a - b).abs().max().item()
                              for a, b in zip(piped, whole_weights, strict=True))
            same = same and loss_diff <= args.tolerance
            bubbles = []
            for step in range(1, args.steps):  # step 0 is the warm-up
                span = max(st["steps"][step]["span"] for st in run["stages"])
                busy = sum(e - s for st in run["stages"]
                           for _, _, s, e in st["steps"][step]["events"])
                bubbles.append(1 - busy / (s_count * span))
            bubbles.sort()
            run["bubble"] = bubbles[len(bubbles) // 2]  # the median step
            run["expected"] = (s_count - 1) / (micro + s_count - 1)
            last = [st["steps"][-1] for st in run["stages"]]
            rows.append({"schedule": run["schedule"], "M": micro,
                         "step ms": f"{1e3 * max(st['span'] for st in last):.0f}",
                         "bubble": f"{run['bubble']:.3f}",
                         "(S-1)/(M+S-1)": f"{run['expected']:.3f}",
                         "held (stage 0)": held_at_most(last[0]["events"]),
                         "messages": sum(len(st["sent"]) for st in last),
                         "values each": "/".join(sorted({str(v) for st in last
                                                         for v in st["sent"]})),
                         "loss diff": f"{loss_diff:.1e}", "weight diff": f"{weight_diff:.1e}"})
        print(format_table(rows))
        print("bubble: the idle share of a step, 1 - (busy time of all stages) / (stages x "
              "step time), median of the timed steps; held: the most micro-batches whose "
              "activations stage 0 kept at once; messages: sent by all stages in the step")
        for step, loss in enumerate(reference, start=1):
            print(f"step {step}/{args.steps}  loss unsplit {loss:.6f}  " + "  ".join(
                f"{r['schedule']} M={r['micro_batches']} {r['stages'][-1]['losses'][step - 1]:.6f}"
                for r in runs))
        print(f"check: the pipeline {'matches' if same else 'DOES NOT match'} the unsplit model "
              f"in every run (tolerance {args.tolerance:g} on the relative loss difference)")
        record = [{"schedule": r["schedule"], "micro_batches": r["micro_batches"],
                   "bubble": r["bubble"], "expected": r["expected"],
                   "events": [st["steps"][-1]["events"] for st in r["stages"]]} for r in runs]
        os.makedirs(os.path.dirname(args.events) or ".", exist_ok=True)
        with open(args.events, "w") as f:
            json.dump({"stages": stages, "device": device.type, "runs": record}, f)
        from ddpcourse.figures.sharding import draw_pipeline

        os.makedirs(os.path.dirname(args.picture) or ".", exist_ok=True)
        draw_pipeline(record, path=args.picture)
        print(f"timeline of the last step of each run: {args.picture} (events: {args.events})")
        print(summary_line(world_size=world_size, stages=stages, same_as_unsplit=same,
                           **{f"bubble_{r['schedule']}_M{r['micro_batches']}": round(r["bubble"], 3)
                              for r in runs},
                           backend=backend, wall_s=round(time.perf_counter() - started, 2)))
        failed = not same
    else:
        failed = False
    end_with_rank_0s_verdict(failed, device)


if __name__ == "__main__":
    main()
