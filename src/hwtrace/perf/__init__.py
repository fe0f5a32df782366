"""The perf.data format: reading (:mod:`.data`, file and pipe mode) and
writing (:mod:`.writer`, :mod:`.rewrite`, :mod:`.wrap`), record layouts
(:mod:`.records`, :mod:`.attr`, :mod:`.features`, :mod:`.user`), what a
perf.data says of its Intel PT (:mod:`.intelpt`: configuration, AUX
queues, the sideband model of :mod:`.sideband`) and of CoreSight
(:mod:`.cs_etm`), and Intel's libipt-sb sideband for ptdump/ptxed
(:mod:`.pevent`, :mod:`.sbsession`).  Decoding a perf.data is
:mod:`hwtrace.session`'s."""

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
