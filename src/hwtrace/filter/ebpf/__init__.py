"""eBPF: instruction set, verifier, interpreter, x86-64 JIT and code generation."""
