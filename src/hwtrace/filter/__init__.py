"""Conditional tracing: LTTng's filter language compiled to several tiers
(LTTng-style bytecode interpreter, eBPF interpreter, eBPF x86-64 JIT, LLVM
native code) that give the same verdict.  See docs/filter-design.md."""
