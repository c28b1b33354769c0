"""Python environments behind a process boundary: ``stepwise.isolated(Env)`` is an environment
class whose objects each run an ``Env`` in a process of their own.

An agent's actions are model-written text, sent to a simulator that may not have been built for
hostile input. In the calling process, a simulator that segfaults on an action takes stepwise and
every other trajectory down with it, and one blocked inside C code (a socket read, a ``sleep``)
holds its call until it returns, since ``step_timeout``'s ``TimeoutError`` lands only when Python
code runs. Behind ``isolated`` the same simulator costs only its own trajectory: a process that
dies ends that trajectory's call with ``EnvironmentProcessError`` (its exit status named), and a
call that outlives ``step_timeout`` (or ``timeout=``) kills the process and raises
``TimeoutError``, whatever the process is doing. ``memory_mb=`` caps each process's address
space (an allocation past it raises ``MemoryError`` there, which ends the trajectory).

The wrapped class (or factory) must be picklable, as ``multiprocessing`` needs it: a class at a
module's top level, or a ``functools.partial`` of one; in a script, the usual
``if __name__ == "__main__":`` guard, as with any ``multiprocessing`` program. The processes are
forked by ``multiprocessing``'s forkserver, a clean single-threaded process started once that has
imported stepwise and the environment's module (a plain ``fork`` beside stepwise's threads is
not safe; a fresh interpreter for each object cost 0.13 s), and they are kept: an object's
process, its environment let go, serves the class's next object (``keep`` of them wait; a process
that crashed or timed out is never reused). ``fork()`` is there when the environment has one (its result
pickled into a process of its own; where it cannot be pickled, a simulator's handle in it, the
actions are replayed in a new process instead), else stepwise replays the actions on a new object
as it does for any environment without ``fork``. ``close_all()`` on the class stops its waiting processes
(they stop with the interpreter anyway).

    >>> trajs = stepwise.play(problems, policy, env=stepwise.isolated(MySimulator), step_timeout=10)
"""

from __future__ import annotations

import multiprocessing
import pickle
import time
from typing import Any, Callable, Optional

__all__ = ["isolated", "EnvironmentProcessError"]

_POLL = 0.05


class EnvironmentProcessError(RuntimeError):
    """An isolated environment's process ended (crashed, killed, or out of memory) mid-call."""


def _serve(conn, memory_mb: Optional[int]) -> None:
    """The child: environments loaded one at a time (`load`: a pickled class, factory or object;
    `drop`), their calls answered, until the parent hangs up."""
    if memory_mb is not None:
        import resource

        limit = memory_mb << 20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    env: Any = None
    while True:
        try:
            method, args = conn.recv()
        except (EOFError, OSError):
            return
        try:
            if method == "load":
                made = pickle.loads(args[0])
                env = made() if callable(made) and not _is_environment(made) else made
                result: Any = {name: callable(getattr(env, name, None)) for name in ("judge", "fork")}
            elif method == "drop":
                env = result = None
            elif method == "fork":
                forked = env.fork()
                try:
                    result = pickle.dumps(forked)
                except (pickle.PicklingError, TypeError, AttributeError) as e:
                    raise _Unpicklable(f"{type(e).__name__}: {e}") from None
            else:
                result = getattr(env, method)(*args)
        except BaseException as e:  # noqa: BLE001 (sent back, raised there)
            _reply(conn, False, e)
            continue
        _reply(conn, True, result)


class _Unpicklable(Exception):
    """A fork's result that cannot cross to another process (a simulator's handle in it)."""


def _is_environment(obj: Any) -> bool:
    """An environment object itself (a forked one), not a class or factory to call."""
    return not isinstance(obj, type) and hasattr(obj, "step") and hasattr(obj, "reset")


def _reply(conn, ok: bool, value: Any) -> None:
    try:
        conn.send((ok, value))
    except Exception as e:  # an unpicklable result or exception: said as text
        conn.send((False, RuntimeError(f"{type(value).__name__}: {value} (and it could not be sent back: {e})")))


_CONTEXT: Any = None


def _context(preload: Optional[str] = None) -> Any:
    """`multiprocessing`'s forkserver: a clean single-threaded server, started once, that forks
    each environment's process (safe beside stepwise's threads, where a plain `fork` is not).
    It imports this module (and with it stepwise's native module) and the first isolated
    environment's module before it forks anything, so a process starts in milliseconds instead
    of an interpreter's start and those imports."""
    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = multiprocessing.get_context("forkserver")
        modules = ["stepwise.isolation"] + ([preload] if preload and preload != "__main__" else [])
        _CONTEXT.set_forkserver_preload(modules)
    return _CONTEXT


class _Process:
    """One environment in a process of its own, spoken to over a pipe."""

    def __init__(self, memory_mb: Optional[int], timeout: Optional[float]):
        ctx = _context()
        self._conn, child = ctx.Pipe()
        self._timeout = timeout
        self._process: Any = ctx.Process(target=_serve, args=(child, memory_mb), daemon=True)
        self._process.start()
        child.close()

    @property
    def alive(self) -> bool:
        return self._process is not None

    def call(self, method: str, *args: Any) -> Any:
        if self._process is None:
            raise EnvironmentProcessError(f"the environment's process ended before this {method}")
        try:
            self._conn.send((method, args))
        except (OSError, ValueError) as e:
            self._stop()
            raise EnvironmentProcessError(f"the environment's process is gone ({e})") from None
        return self._wait(method)

    def _wait(self, method: str) -> Any:
        deadline = None if self._timeout is None else time.monotonic() + self._timeout
        try:
            # Short waits, so that step_timeout's TimeoutError (raised in this thread between
            # two bytecodes) lands; the process is killed on its way out.
            while not self._conn.poll(_POLL):
                if not self._process.is_alive() and not self._conn.poll(0):
                    break
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(f"the environment's {method} did not answer within {self._timeout} s")
            ok, value = self._conn.recv()
        except TimeoutError:  # an OSError too: not the process's end
            self._stop()
            raise
        except (EOFError, OSError):
            code = self._stop()
            raise EnvironmentProcessError(
                f"the environment's process ended during its {method} ({_status(code)})"
            ) from None
        except BaseException:
            self._stop()
            raise
        if not ok:
            raise value
        return value

    def _stop(self) -> Optional[int]:
        """Kills the process (if it runs) and returns its exit code."""
        process, self._process = self._process, None
        if process is None:
            return None
        if process.is_alive():
            process.kill()
        process.join(5)
        try:
            self._conn.close()
        except OSError:  # at interpreter exit, multiprocessing may have closed it first
            pass
        return process.exitcode

    def close(self) -> None:
        self._stop()


class _Pool:
    """Idle processes of one isolated class, handed to its next objects: an object's process is
    started once and reused when the object is dropped (its environment let go), so that a
    trajectory or a fork costs a message, not an interpreter's start. At most `keep` wait."""

    def __init__(self, memory_mb: Optional[int], timeout: Optional[float], keep: int):
        import threading

        self._memory_mb, self._timeout, self._keep = memory_mb, timeout, keep
        self._idle: list = []
        self._lock = threading.Lock()

    def load(self, blob: bytes) -> tuple:
        """A process with the environment `blob` loaded in it, and what its objects have."""
        with self._lock:
            process = self._idle.pop() if self._idle else None
        process = process or _Process(self._memory_mb, self._timeout)
        try:
            return process, process.call("load", blob)
        except BaseException:
            process.close()
            raise

    def give_back(self, process: _Process) -> None:
        """`process`'s environment let go and the process kept for the next object, or stopped
        (it failed, or enough wait)."""
        if not process.alive:
            return
        try:
            process.call("drop")
        except BaseException:  # noqa: BLE001 (a process that cannot drop is not kept)
            process.close()
            return
        with self._lock:
            if len(self._idle) < self._keep:
                self._idle.append(process)
                return
        process.close()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for process in idle:
            process.close()




def _status(code: Optional[int]) -> str:
    if code is None:
        return "exit status unknown"
    if code < 0:
        import signal

        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def isolated(
    env: Callable[..., Any],
    *args: Any,
    timeout: Optional[float] = None,
    memory_mb: Optional[int] = None,
    keep: int = 8,
    **kwargs: Any,
) -> type:
    """An environment class whose objects each run ``env(*args, **kwargs)`` in a process of their
    own (see the module's documentation): pass it as ``env=`` to ``stepwise.play``,
    ``stepwise.label_actions`` or ``stepwise.agent_rl``. ``timeout`` bounds each call in seconds,
    the object's start too (stepwise's ``step_timeout`` bounds ``reset``, ``step`` and ``fork``;
    either kills the process); ``memory_mb`` caps each process's address space (all of it: about
    100 MB are Python's and stepwise's before the environment's own; 256 at least); ``keep`` processes
    at most wait for the next object. ``judge`` and ``fork`` are there when ``env``'s objects have
    them (``fork``'s result must be picklable)."""
    import functools

    factory = functools.partial(env, *args, **kwargs) if args or kwargs else env
    try:
        blob = pickle.dumps(factory)
    except Exception as e:
        raise TypeError(
            f"isolated({getattr(env, '__name__', env)!r}): the environment must be picklable "
            f"(a class at a module's top level, or a functools.partial of one): {e}"
        ) from None
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout={timeout}: a positive number of seconds")
    if memory_mb is not None and memory_mb < 256:
        raise ValueError(f"memory_mb={memory_mb}: at least 256 (the cap counts the process's whole address space, "
                         "about 100 MB before the environment's own)")
    if keep < 0:
        raise ValueError(f"keep={keep}: 0 or more processes")
    inner = factory.func if isinstance(factory, functools.partial) else factory
    _context(getattr(inner, "__module__", None))
    pool = _Pool(memory_mb, timeout, keep=keep)

    # Whether forks are replayed: the environment's own fork gave something that cannot be
    # pickled (a simulator's handle), found out once for the class.
    replay = [False]

    def __init__(self, _loaded: Optional[bytes] = None) -> None:
        self._env, _ = pool.load(_loaded or blob)
        self._problem = None
        self._actions = []

    def reset(self, problem: Any) -> Any:
        first = self._env.call("reset", problem)
        self._problem, self._actions = problem, []
        return first

    def step(self, action: str) -> Any:
        got = self._env.call("step", action)
        self._actions.append(action)
        return got

    def judge(self, action: str) -> Any:
        return self._env.call("judge", action)

    def fork(self) -> Any:
        if not replay[0]:
            try:
                other = type(self)(self._env.call("fork"))
                other._problem, other._actions = self._problem, list(self._actions)
                return other
            except _Unpicklable:
                replay[0] = True
        # As stepwise forks an environment without `fork`: the same actions on a new object.
        other = type(self)()
        other.reset(self._problem)
        for action in self._actions:
            other.step(action)
        return other

    def close(self) -> None:
        """Lets this object's environment go (its process waits for the next object)."""
        env, self._env = getattr(self, "_env", None), None
        if env is not None:
            pool.give_back(env)

    methods = {"__init__": __init__, "reset": reset, "step": step, "close": close, "__del__": close}
    # As the environment's own objects: stepwise asks for `judge` and `fork` by name. What they
    # have is read from one object, made now in the first process (kept for the next).
    process, has = pool.load(blob)
    pool.give_back(process)
    methods.update({name: f for name, f in [("judge", judge), ("fork", fork)] if has[name]})
    name = f"Isolated{getattr(env, '__name__', 'Environment')}"
    cls = type(name, (), methods)
    cls.close_all = staticmethod(pool.close)  # type: ignore[attr-defined]
    return cls
