"""perf's configuration, as far as hwtrace follows it: where the build-id
cache is.

perf reads its settings (``perf config``) from ``/etc/perfconfig``, then
``~/.perfconfig``, or only from the file ``$PERF_CONFIG`` names when that
is set (``/dev/null``: none); they are git-config files (``[section]``
headers, ``name = value`` lines, ``#`` and ``;`` comments).  The build-id
cache, where ``perf record`` keeps copies of the binaries a recording ran
and perf looks for them, is the setting ``buildid.dir``, else
``$HOME/.debug`` (perf's ``set_buildid_dir``).  A file that cannot be
read or parsed counts as empty, as perf warns and goes on.
"""

from __future__ import annotations

import os
from pathlib import Path

_SYSTEM = "/etc/perfconfig"


def _files() -> list[Path]:
    exclusive = os.environ.get("PERF_CONFIG")
    if exclusive is not None:
        return [Path(exclusive)] if exclusive else []
    files = [] if os.environ.get("PERF_CONFIG_NOSYSTEM") else [Path(_SYSTEM)]
    home = os.environ.get("HOME")
    if home:
        files.append(Path(home) / ".perfconfig")
    return files


def _value(text: str) -> str:
    """A value as git-config spells it: up to a comment outside quotes,
    quotes removed, surrounding blanks dropped."""
    out, quoted = [], False
    for ch in text.strip():
        if ch == '"':
            quoted = not quoted
        elif ch in "#;" and not quoted:
            break
        else:
            out.append(ch)
    return "".join(out).strip()


def perf_config_value(section: str, name: str) -> str | None:
    """The last value of ``section.name`` in perf's configuration files
    (a later file's value wins, as perf reads them), None when unset."""
    found = None
    for path in _files():
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        current = None
        for line in text.splitlines():
            line = line.strip()
            if not line or line[0] in "#;":
                continue
            if line.startswith("["):
                head = line[1 : line.find("]")] if "]" in line else ""
                current = head.split()[0].lower() if head.split() else None
                continue
            key, eq, rest = line.partition("=")
            if current == section and key.strip().lower() == name:
                found = _value(rest) if eq else "true"
    return found


def buildid_dir() -> Path:
    """perf's build-id cache: ``buildid.dir``, else ``$HOME/.debug``."""
    configured = perf_config_value("buildid", "dir")
    if configured:
        return Path(configured)  # (as perf takes it: no ~ expanded)
    home = os.environ.get("HOME")
    return Path(home) / ".debug" if home else Path(".debug")
