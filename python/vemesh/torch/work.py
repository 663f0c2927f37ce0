"""vemesh.torch.Work: a vemesh operation that torch can wait on.

What every ``ProcessGroupVemesh`` method returns: a
``torch.distributed`` ``Work`` (torch 1.13's ``torch._C._distributed_c10d.Work``,
subclassed through its pybind trampoline) over one or more ``vemesh.Work``
handles, plus what must happen once they finished (copying a gathered
buffer into torch's list of outputs)::

    work = dist.all_reduce(t, group=pg, async_op=True)   # a vemesh.torch.Work
    work.is_completed()                                   # vemesh.Work's look
    work.wait()                                           # vemesh.Work.wait
    fut = work.get_future()                               # torch.futures.Future
    fut.wait()                                            # [t]

``wait`` blocks with the GIL released (vemesh.Work.wait) and raises the
operation's error: ValueError for arguments the ranks disagree on, TimeoutError
past the communicator's timeout, vemesh.Error otherwise. ``get_future`` is
what DDP's reducer and communication hooks use: its value, a list of the
output tensors, is set by one completer thread per process that waits for the
operations in the order they were asked for.

torch keeps only the C++ half of a Work it holds (pybind11 trampolines lose
the Python half once Python drops it), so a Work keeps itself alive until it
is settled: waited for, or its future set.
"""

import atexit
import collections
import threading

import torch
from torch._C._distributed_c10d import Work as _TorchWork

# Works not settled yet: torch's C++ callers (DDP's reducer,
# _broadcast_coalesced) hold only the C++ half.
_UNSETTLED = set()
_UNSETTLED_LOCK = threading.Lock()


class Work(_TorchWork):
    """One torch-facing operation over ``vemesh.Work`` handles.

    ``works``: the vemesh.Work handles (all of them must finish).
    ``result``: the tensors the future gives (torch's ``Work.result()``).
    ``finish``: called once, after they finished, before anyone sees the
    result (copies out of a scratch buffer).
    ``timeout``: seconds a wait without its own timeout waits (the
    communicator's; None: no bound).
    """

    def __init__(self, name, works, result, finish=None, timeout=None,
                 source_rank=-1):
        super().__init__()
        self._name = name
        self._works = list(works)
        self._result = list(result)
        self._finish = finish
        self._timeout = timeout
        self._src = source_rank
        self._lock = threading.Lock()
        self._done = False
        self._error = None
        self._future = None
        with _UNSETTLED_LOCK:
            _UNSETTLED.add(self)

    # -- what torch calls ---------------------------------------------------

    def wait(self, timeout=None):
        """Blocks until the operation finished; True. ``timeout`` (a
        timedelta or seconds; 0 or None: the communicator's) bounds it."""
        seconds = _seconds(timeout)
        try:
            self._complete(self._timeout if seconds is None else seconds)
        finally:
            if self._done:
                self._settle()
        return True

    def is_completed(self):
        """One look, never blocks: True once finished (and the finish step
        ran; an error is then wait()'s to raise)."""
        if self._done:
            return True
        if not self._lock.acquire(blocking=False):
            return False  # another thread is completing it
        try:
            if not all(w.is_completed() for w in self._works):
                return False
        finally:
            self._lock.release()
        try:
            self._complete(self._timeout)  # finished: the finish step runs
        except Exception:  # noqa: BLE001 (kept for wait() to raise)
            pass
        return self._done

    def is_success(self):
        return self.is_completed() and self._error is None

    def exception(self):
        return self._error

    def result(self):
        self.wait()
        return self._result

    def source_rank(self):
        return self._src

    def _source_rank(self):
        return self._src

    def synchronize(self):
        """Host memory only: nothing to order after the wait."""

    def get_future(self):
        """A torch.futures.Future set (by the completer thread) to the
        output tensors once the operation finished, or to its error."""
        with self._lock:
            if self._future is not None:
                return self._future
            self._future = torch.futures.Future()
            future = self._future
        _completer().submit(self)
        return future

    def __repr__(self):
        state = "completed" if self._done else "running"
        return f"vemesh.torch.Work({self._name}, {state})"

    # -- inside -------------------------------------------------------------

    def _complete(self, timeout):
        """Waits for every vemesh.Work and runs the finish step once; raises
        the operation's error (the same one on every later call)."""
        with self._lock:
            if not self._done:
                try:
                    for w in self._works:
                        w.wait(timeout=timeout)
                    if self._finish is not None:
                        self._finish()
                except TimeoutError:
                    raise  # the vemesh.Work aborted its group; not done
                except BaseException as e:  # noqa: B036 (kept, re-raised)
                    self._error = e
                self._done = True
                self._works = []
                self._finish = None
            if self._error is not None:
                raise self._error

    def _settle(self):
        with _UNSETTLED_LOCK:
            _UNSETTLED.discard(self)

    def _complete_future(self):
        """The completer thread's part: wait, then set the future."""
        try:
            self._complete(self._timeout)
        except BaseException as e:  # noqa: B036 (handed to the future)
            self._future.set_exception(e)
        else:
            self._future.set_result(self._result)
        finally:
            self._settle()


def _seconds(timeout):
    if timeout is None:
        return None
    seconds = (timeout.total_seconds() if hasattr(timeout, "total_seconds")
               else float(timeout))
    return None if seconds <= 0 else seconds  # torch's 0: its default


class _Completer:
    """One daemon thread: waits for each Work whose future was asked for, in
    that order, and sets the future. vemesh.Work.wait releases the GIL, so
    the thread holds it only to set a result."""

    def __init__(self):
        self._queue = collections.deque()
        self._busy = False
        self._ready = threading.Condition()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="vemesh.torch completer")
        self._thread.start()

    def submit(self, work):
        with self._ready:
            self._queue.append(work)
            self._ready.notify()

    def _run(self):
        while True:
            with self._ready:
                while not self._queue:
                    self._busy = False
                    self._ready.notify_all()
                    self._ready.wait()
                self._busy = True
                work = self._queue.popleft()
            work._complete_future()

    def drain(self, timeout):
        """Waits up to ``timeout`` seconds for every submitted Work (at exit:
        a daemon thread must not be inside a wait when Python finalises)."""
        with self._ready:
            self._ready.wait_for(lambda: not self._queue and not self._busy,
                                 timeout)


_COMPLETER = None
_COMPLETER_LOCK = threading.Lock()


def _completer():
    global _COMPLETER
    with _COMPLETER_LOCK:
        if _COMPLETER is None:
            _COMPLETER = _Completer()
            atexit.register(_COMPLETER.drain, 30.0)
        return _COMPLETER
