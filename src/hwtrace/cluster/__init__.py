"""Decoding one perf.data's Intel PT on a Dask cluster (Dask ``distributed``),
with exactly the rows of the single-process :func:`hwtrace.session.perfflow.stream_perf`:
as blocks handed to the client (:func:`decode_distributed`) or as Parquet
written by the workers (:func:`decode_to_parquet`)."""

from .decode import (
    ClusterOptions,
    DistributedError,
    decode_distributed,
    decode_to_parquet,
    plan_pieces,
)

__all__ = [
    "ClusterOptions",
    "DistributedError",
    "decode_distributed",
    "decode_to_parquet",
    "plan_pieces",
]
