"""Linux perf_event data: record layouts (:mod:`.records`) and Intel's
libipt-sb sideband emulation for ptdump/ptxed (:mod:`.pevent`, :mod:`.session`)."""

from .records import (
    Record,
    RecordError,
    RecordType,
    SampleId,
    SampleType,
    pack_record,
    pack_sample_id,
    parse_record,
    parse_sample_id,
    sample_id_size,
)

__all__ = [
    "Record",
    "RecordError",
    "RecordType",
    "SampleId",
    "SampleType",
    "pack_record",
    "pack_sample_id",
    "parse_record",
    "parse_sample_id",
    "sample_id_size",
]
