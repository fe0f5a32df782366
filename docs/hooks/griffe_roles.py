"""Griffe extension: Sphinx roles in hwtrace's docstrings as Markdown code.

hwtrace's docstrings name things Sphinx's way (``:func:`decode_trace```,
``:class:`~hwtrace.image.Image```); Markdown would print the role's name.
This rewrites each role to a code span of its target (``~`` keeping the last
component, as Sphinx shows it) when griffe loads the docstring, so the
source files stay as they are.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|attr|mod|data|exc|obj|const):`(~?)([^`]+)`")


def rewrite_roles(text: str) -> str:
    """``:role:`target``` to `` `target` `` (``~a.b.c`` to `` `c` ``)."""

    def code(match: re.Match[str]) -> str:
        target = match.group(2)
        if match.group(1):
            target = target.rsplit(".", 1)[-1]
        return f"`{target}`"

    return _ROLE.sub(code, text)


class SphinxRoles(griffe.Extension):
    """Rewrite Sphinx cross-reference roles in every docstring."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = rewrite_roles(obj.docstring.value)
