"""The shape policy's part of ``train_autotuned.py``, as plain code (no torch import here).

``autotune.codegen`` fills ``SHAPES`` (``$shapes``, ``$lengths``, ``$worst``, ``$count``,
``$multiple``) and puts it into ``codegen_templates.SCRIPT`` (``$shapes_block``), only for a
workload that declares its lengths: each batch is padded as the tuned policy says (to the worst
case, to buckets, or to its own longest sample, dynamic or not), and the synthetic batches draw
their lengths from the declared sample. A fixed-shape workload's script carries none of it.
"""

SHAPES = '''
# Batches of varying length (the workload declares its lengths): each is padded as the tuned
# shape policy says. Memory was measured at the worst case; speed on these lengths.
shapes = $shapes  # max (pad to the worst case), buckets (to bucket_lengths), dynamic or longest
# A sample of real sequence lengths (None: every batch at one shape).
lengths = $lengths
# The worst-case length (memory was measured there).
worst_length = $worst


def bucket_lengths_of(lengths, micro_batch, count=$count, multiple=$multiple):
    """Up to `count` lengths, ascending, the last the longest: one static graph each. A batch
    is padded to its longest sample: each bucket is a quantile k/count of that longest length
    (the lengths' quantile (k/count) ** (1/micro_batch)), rounded up to `multiple`."""
    ordered = sorted(lengths)
    chosen = set()
    for k in range(1, count + 1):
        at = ordered[max(0, math.ceil((k / count) ** (1 / micro_batch) * len(ordered)) - 1)]
        chosen.add(min(ordered[-1], -(-at // multiple) * multiple))
    return sorted(chosen)


def pad_to(longest):
    """The length a batch whose longest sample has `longest` tokens is padded to."""
    if shapes in ("dynamic", "longest"):  # each batch at its own longest sample
        return longest
    if shapes == "buckets":
        return next((b for b in bucket_lengths if b >= longest), worst_length)
    return worst_length


if lengths:
    bucket_lengths = bucket_lengths_of(lengths, micro_batch)
    if shapes == "buckets":
        compile_dynamic = False  # one static graph per bucket, under the recompile limit
    make_batch_at = get_batch
    move_batch = to_device

    def get_batch(micro_batch):
        """Synthetic: the longest of micro_batch lengths drawn from the sample, padded to
        pad_to(longest). Your collate pads each batch of real data to pad_to(its longest)."""
        longest = max(random.choices(lengths, k=micro_batch))
        return make_batch_at(micro_batch, pad_to(longest))

    def to_device(batch, device):
        batch = move_batch(batch, device)
        if shapes == "dynamic":  # one graph for every length: the sequence dim is dynamic
            for tensor in batch.values() if isinstance(batch, dict) else batch:
                if tensor.dim() >= 2:
                    torch._dynamo.mark_dynamic(tensor, 1)
        return batch

'''
