"""The loop: :class:`MainLoop`, and what belongs to it alone.

- :mod:`.loop`: :class:`MainLoop`: how it is built, what it answers (parameters,
  predictions, scores), stop requests;
- :mod:`.building`: its inputs checked, the training executors bound with the
  private heads its extensions ask for;
- :mod:`.epochs`: :class:`~.epochs.Training`, the epochs of batches and the hooks
  around them;
- :mod:`.stops`: :class:`~.stops.StopRequests`, who asked to stop, and every
  worker stopping after the same batch;
- :mod:`.accumulation`: the optimizer step after each backward pass, and
  gradients accumulated over several batches;
- :mod:`.resumption`: which checkpoint resumes the loop;
- :mod:`.state`: what a checkpoint holds of the loop, and how resumption gives it back;
- :mod:`.interrupt`: what Ctrl-C and SIGTERM mean, from the handler to the exit status.
"""

from .loop import MainLoop

__all__ = ["MainLoop"]
