"""Filter errors: one message that names the place, never a traceback."""

from __future__ import annotations


class FilterError(ValueError):
    """A filter that cannot be compiled or run: syntax, types, unknown
    fields, tier limits, or eBPF that fails verification.

    ``column`` (1-based) points into ``expression`` when the problem has a
    place in the filter text; ``str()`` then shows the text with a caret
    under that column.  ``where`` names another kind of place (an eBPF
    instruction index, a schema file and line).
    """

    def __init__(
        self,
        message: str,
        *,
        expression: str | None = None,
        column: int | None = None,
        where: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.expression = expression
        self.column = column
        self.where = where

    def __str__(self) -> str:
        head = f"{self.where}: {self.message}" if self.where else self.message
        if self.expression is None or self.column is None:
            return head
        line = self.expression.replace("\n", " ").replace("\t", " ")
        caret = " " * max(self.column - 1, 0) + "^"
        return f"column {self.column}: {head}\n  {line}\n  {caret}"


class VerifierError(FilterError):
    """Hand-written or generated eBPF that the verifier rejects; ``where``
    is ``insn N`` (index of the offending instruction)."""
