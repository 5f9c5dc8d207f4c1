"""l8_memory_calculator: 5 of 9. "fsdp" taken to keep whole weights, like zero2.

FSDP gathers each layer's weights for its forward and backward, but between steps (and
outside the layer being computed) a rank keeps only its shard of them: fully sharded, the
same as ZeRO stage 3. Only FSDP's SHARD_GRAD_OP mode keeps whole weights.
"""

SHARDED = {"ddp": (), "zero1": ("optimizer",), "zero2": ("optimizer", "grads"),
           "zero3": ("optimizer", "grads", "params"), "fsdp": ("optimizer", "grads")}
