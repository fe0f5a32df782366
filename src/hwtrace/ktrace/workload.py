"""The command a tracing session runs: started held before ``exec`` until
tracing is on, so that its process exists (it can be tracked by pid) but
runs nothing of its own untraced; ``perf record -- COMMAND`` does the same
with its workload (``evlist__prepare_workload``: the child waits on a pipe
for the go).  ``poll``, ``wait``, ``kill`` and ``terminate`` are Popen's."""

from __future__ import annotations

import os
import signal
from collections.abc import Sequence


class HeldCommand:
    """``command`` forked and held before exec until :meth:`release`;
    ``env``: its environment (default this process's); ``pass_fd``: a file
    descriptor it inherits; ``prog`` names the tool in the one line said
    when the command cannot be run (exit status 127).  A command never
    released is killed by :meth:`close`."""

    def __init__(
        self,
        command: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        pass_fd: int | None = None,
        prog: str = "hwtrace",
    ) -> None:
        command = list(command)
        env = dict(os.environ if env is None else env)
        r, w = os.pipe()
        if pass_fd is not None:
            os.set_inheritable(pass_fd, True)
        pid = os.fork()
        if pid == 0:  # the child: wait for the go, then become the command
            try:
                os.close(w)
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                if os.read(r, 1) == b"g":
                    os.close(r)
                    os.execvpe(command[0], command, env)
            except OSError as e:
                os.write(2, f"{prog}: cannot run {command[0]}: {e.strerror}\n".encode())
                os._exit(127)
            os._exit(127)
        os.close(r)
        if pass_fd is not None:
            os.set_inheritable(pass_fd, False)
        self.pid = pid
        self.returncode: int | None = None
        self._go: int | None = w

    def release(self) -> None:
        """Let the command run (exec it)."""
        if self._go is not None:
            os.write(self._go, b"g")
            os.close(self._go)
            self._go = None

    def close(self) -> None:
        """Kill the command if it was never released: it must not run
        untraced."""
        if self._go is not None:
            self.kill()
            os.close(self._go)
            self._go = None

    def _status(self, status: int) -> int:
        self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self._status(status)
        return self.returncode

    def wait(self) -> int:
        if self.returncode is None:
            self._status(os.waitpid(self.pid, 0)[1])
        return self.returncode  # type: ignore[return-value]

    def kill(self, signum: int = signal.SIGKILL) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.kill(signal.SIGTERM)


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, exited but not yet reaped,
    does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False
