"""l8_memory_calculator: 2 of 9. ZeRO's stages shifted: stage 1 shards the gradients too.

zero1 shards the optimizer state and the gradients, zero2 everything: one stage ahead of
the paper (stage 1 shards the optimizer state only, stage 2 adds the gradients, stage 3
the weights).
"""

SHARDED = {"ddp": (), "zero1": ("optimizer", "grads"),
           "zero2": ("optimizer", "grads", "params"),
           "zero3": ("optimizer", "grads", "params"), "fsdp": ("optimizer", "grads", "params")}
