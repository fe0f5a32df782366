"""The tracepoint programs a kernel-side object owns, attached and let go
together (the followed process set, the latency tracker, the code
capture agent's kernel side)."""

from __future__ import annotations

import numpy as np

from ..kernel import bpf
from ..kernel.tracepoint import Attachment

__all__ = ["TracepointPrograms"]


class TracepointPrograms:
    """Tracepoint programs and the tracepoints each goes to (a program may
    serve several): :meth:`attach` attaches them all, :meth:`detach` lets
    go, :meth:`close` also unloads the programs."""

    def __init__(self) -> None:
        self.plan: list[tuple[bpf.Program, str, str]] = []
        self.attachments: list[Attachment] = []

    def load(self, code: np.ndarray, name: str, system: str, event: str) -> bpf.Program:
        """Load ``code`` as tracepoint program ``name``, for ``system:event``."""
        program = bpf.Program(bpf.PROG_TRACEPOINT, code, name=name)
        self.add(program, system, event)
        return program

    def add(self, program: bpf.Program, system: str, event: str) -> None:
        """A loaded program for ``system:event`` too."""
        self.plan.append((program, system, event))

    def attach(self) -> None:
        for program, system, event in self.plan:
            self.attachments.append(Attachment(program, system, event))

    def detach(self) -> None:
        for a in self.attachments:
            a.close()
        self.attachments = []

    @property
    def programs(self) -> list[bpf.Program]:
        """The loaded programs, each once."""
        return list({id(p): p for p, _, _ in self.plan}.values())

    def close(self) -> None:
        self.detach()
        for program in self.programs:
            program.close()
        self.plan = []
