"""The loop: :class:`MainLoop`, and what belongs to it alone.

- :mod:`.loop`: :class:`MainLoop`: how it is built, epochs of batches, hooks, stop requests;
- :mod:`.accumulation`: the optimizer step after each backward pass, and
  gradients accumulated over several batches;
- :mod:`.resumption`: which checkpoint resumes the loop;
- :mod:`.state`: what a checkpoint holds of the loop, and how resumption gives it back;
- :mod:`.interrupt`: what Ctrl-C and SIGTERM mean, from the handler to the exit status.
"""

from .loop import MainLoop

__all__ = ["MainLoop"]
