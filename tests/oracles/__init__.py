"""The test suite's oracles: hwtrace's semantics written a second time,
plainly, for the production code to be held to.

* :mod:`oracles.events`, :mod:`oracles.flow`: Intel's event and block
  decoders (libipt's semantics) in plain Python, against which the
  compiled flow decoder (:mod:`hwtrace.pt._flowloop`) is checked;
* :mod:`oracles.decode`: a whole trace decoded with them the way
  :func:`hwtrace.pt.decode.decode_trace` decodes it;
* :mod:`oracles.ptxed`: ``hwtrace ptxed``'s output printed from them;
* :mod:`oracles.filter`: the filter semantics every filter tier is tested
  against (docs/filter-design.md).

They are slow on purpose and never used outside the tests.
"""
