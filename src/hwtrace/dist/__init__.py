"""Decoding one perf.data's Intel PT on a Dask cluster (Dask ``distributed``),
with exactly the rows of the single-process :func:`hwtrace.perf.trace.stream_perf`."""

from .decode import DistributedError, decode_distributed, plan_pieces

__all__ = ["DistributedError", "decode_distributed", "plan_pieces"]
