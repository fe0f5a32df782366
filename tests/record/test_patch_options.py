"""The patch backend's options and its shared buffers, without a program:
options the routines cannot take are refused when made, and the buffers
close even while a view of them is held (a traceback holds one when
setting a thread up fails: closing then hid that error behind a
BufferError)."""

from __future__ import annotations

import os

import pytest

from hwtrace.record.patch.tracer import PatchOptions, _Pool


@pytest.mark.parametrize(("options", "message"), [
    ({"mtc_period": 99}, "mtc_period 99: 0 to 15"),
    ({"mtc_period": -1}, "mtc_period -1: 0 to 15"),
    ({"psb_period": 0}, "psb_period 0: bytes between PSB"),
])  # fmt: skip
def test_options_the_routines_cannot_take_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        PatchOptions(**options)
    PatchOptions(mtc_period=15, psb_period=1)  # the limits themselves are fine


def test_the_buffers_close_while_a_view_of_them_is_held():
    pool = _Pool(PatchOptions(buffer_size=1 << 16, max_threads=1), os.getpid())
    try:
        held = pool.words(0)
        pool.close()  # (raised BufferError)
        held[0] = 7  # the memory stays mapped while the view lives
        assert held[0] == 7
    finally:
        os.unlink(pool.path)
