"""The output of one ``mxoid launch`` job: every process's lines, prefixed, and the launcher's.

:class:`JobOutput` reads the pipes of the processes a
:class:`~mxoid.distributed.processes.Job` started, without blocking; writes
each complete line with its process's label (``[worker 0] ...``: a worker's
rank once it has told it, see :func:`mxoid.distributed.tell_launcher_rank`);
holds back the output of a process until it is shown (the scheduler's, until it
listens); takes out the lines an agent or a worker writes for the launcher
(:data:`~mxoid.distributed.agent.AGENT_TAG`); keeps each process's last error
lines for the job's one-line reason; and notes when anything was last said
(the stall check).
"""

from __future__ import annotations

import os
import selectors
import time
from typing import BinaryIO, Callable, Sequence

from .agent import AGENT_TAG, parse_agent_line
from .launched import _ERROR_LINE, LaunchedProcess

__all__ = ["JobOutput"]

AGENT_TAG_BYTES = AGENT_TAG.encode()


class JobOutput:
    """The pipes of a job's processes, and the launcher's own stdout and stderr.

    Parameters
    ----------
    stdout, stderr : binary file
        Where the processes' lines (with their prefix) and the launcher's notes go.
    """

    def __init__(self, stdout: BinaryIO, stderr: BinaryIO) -> None:
        self.out = {1: stdout, 2: stderr}
        self.selector = selectors.DefaultSelector()
        self.last_activity = time.monotonic()

    def register(self, process: LaunchedProcess, show: bool) -> None:
        """Read ``process``'s stdout and stderr; with ``show=False``, hold its lines back."""
        for stream, fd in ((process.popen.stdout, 1), (process.popen.stderr, 2)):
            assert stream is not None
            os.set_blocking(stream.fileno(), False)
            self.selector.register(stream, selectors.EVENT_READ, (process, fd, show))

    def pump(self, wait: float) -> None:
        """Copy available output, line by line with a prefix, for up to ``wait`` seconds."""
        for key, _ in self.selector.select(wait):
            process, fd, show = key.data
            try:
                chunk = os.read(key.fileobj.fileno(), 65536)
            except BlockingIOError:
                continue
            if chunk:
                data = process.partial.pop(fd, b"") + chunk
                lines, _, rest = data.rpartition(b"\n")
                if rest:
                    process.partial[fd] = rest
            else:  # end of file: the last line, even unfinished
                self.selector.unregister(key.fileobj)
                key.fileobj.close()
                lines = process.partial.pop(fd, b"")
            if fd == 2 and (process.host is not None or AGENT_TAG_BYTES in lines):
                lines = self.agent_lines(process, lines)
            if lines or process.partial.get(fd):
                self.last_activity = time.monotonic()
            if not lines:
                continue
            if fd == 2:
                process.errors += [
                    line.decode(errors="replace").strip()
                    for line in lines.splitlines()
                    if _ERROR_LINE.match(line.decode(errors="replace").strip())
                ]
                del process.errors[:-5]
            if show:
                self.write(process, fd, lines)
            else:
                process.held[fd] = process.held.get(fd, b"") + lines + b"\n"

    def agent_lines(self, process: LaunchedProcess, lines: bytes) -> bytes:
        """Take the lines for the launcher (an agent's, a worker's rank) out of ``lines``."""
        kept = []
        for line in lines.split(b"\n"):
            words = parse_agent_line(line.decode(errors="replace"))
            if words is None:
                kept.append(line)
            elif words[:1] == ["ticks"] and words[1:2] and words[1].isdigit():
                process.remote_ticks = int(words[1])
            elif words[:1] == ["listening"] and words[1:2] and words[1].isdigit():
                process.listening_port = int(words[1])
            elif words[:1] == ["rank"] and words[1:2] and words[1].isdigit():
                relabelled = process.heard_rank(int(words[1]))
                if relabelled:
                    self.note(relabelled)
            elif words[:1] == ["exited"] and words[1:2] and words[1].lstrip("-").isdigit():
                process.remote_code = int(words[1])  # 143: it exited so, not killed by SIGTERM
        return b"\n".join(kept)

    def write(self, process: LaunchedProcess, fd: int, data: bytes) -> None:
        """Write lines of ``process`` to our stdout (fd 1) or stderr (fd 2), with its prefix."""
        prefix = f"[{process.label}] ".encode()
        stream = self.out[fd]
        stream.write(b"".join(prefix + line + b"\n" for line in data.splitlines()))
        stream.flush()

    def show_held_output(self, process: LaunchedProcess) -> None:
        """Write the output held back so far, and show the rest as it comes."""
        for fd, held in process.held.items():
            self.write(process, fd, held)
        process.held.clear()
        for key in list(self.selector.get_map().values()):
            if key.data[0] is process:
                self.selector.modify(
                    key.fileobj, selectors.EVENT_READ, (process, key.data[1], True)
                )

    def note(self, message: str) -> None:
        """Write one line of the launcher's own to stderr."""
        self.out[2].write(f"mxoid launch: {message}\n".encode())
        self.out[2].flush()

    def forget(self, process: LaunchedProcess) -> None:
        """Stop reading ``process`` (it ended)."""
        for key in list(self.selector.get_map().values()):
            if key.data[0] is process:
                self.selector.unregister(key.fileobj)
                key.fileobj.close()

    def read_for(self, seconds: float, pump: Callable[[float], None]) -> None:
        """Call ``pump`` until every pipe is at its end, for at most ``seconds``."""
        limit = time.monotonic() + seconds
        while self.selector.get_map() and time.monotonic() < limit:
            pump(0.05)

    def close(self, processes: Sequence[LaunchedProcess]) -> None:
        """Stop reading every pipe; write each process's unfinished last line."""
        for key in list(self.selector.get_map().values()):
            self.selector.unregister(key.fileobj)
            key.fileobj.close()
        for process in processes:
            for fd, rest in process.partial.items():
                self.write(process, fd, rest)
            process.partial.clear()
