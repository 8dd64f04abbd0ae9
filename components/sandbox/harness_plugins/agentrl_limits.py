"""Time limits that load does not move: CPU time, and wall time less the time starved.

A loop burns CPU time on every machine, so `cpu_s` is counted in the process's CPU time
(user + system, ITIMER_PROF). Code that waits (a sleep, a blocking read) burns none; it is
stopped after `own_s` of wall-clock time *not counting the time it was runnable but waiting
for a core* (the kernel's run delay, /proc/self/schedstat): time other processes took is
not the code's. Where the kernel keeps no schedstat the whole wall time counts, times
`WALL_FACTOR`. Stand-alone (stdlib only): it runs under any task interpreter.

Signals: SIGPROF and SIGALRM, handled in the main thread; `on_hit(kind)` ("cpu" or "wait")
is called from the handler and is expected to raise. It is called at most once per `arm()`,
and never after `cancel()`: Python runs a signal's handler at the next bytecode, so a
signal the kernel delivered just before `cancel()` (or the other timer's signal, pending
while the first handler raised) would otherwise raise in the caller's `except`/`finally`.
"""

import signal
import time

WALL_FACTOR = 10.0  # the wall limit, in multiples of `own_s`, where schedstat is missing
_armed = [0]  # the generation of the armed limits; 0 while none is armed


def starved_s():
    """Seconds the main thread has been runnable but not running, or None (no schedstat)."""
    try:
        with open("/proc/self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


def arm(cpu_s, own_s, on_hit):
    """Start both limits; `cancel()` stops them."""
    start, starved0 = time.monotonic(), starved_s()
    wall_s = own_s if starved0 is not None else own_s * WALL_FACTOR
    generation = _armed[0] = abs(_armed[0]) + 1

    def on_cpu(signum, frame):
        __tracebackhide__ = True
        if _armed[0] != generation:  # cancelled, or the other limit already hit
            return
        cancel()
        on_hit("cpu")

    def on_wall(signum, frame):
        __tracebackhide__ = True
        if _armed[0] != generation:
            return
        now = starved_s()
        own = time.monotonic() - start - (now - starved0 if now is not None else 0.0)
        if own < wall_s - 1e-3:  # starved part of the time: wait for the rest
            signal.setitimer(signal.ITIMER_REAL, wall_s - own)
            return
        cancel()
        on_hit("wait")

    signal.signal(signal.SIGPROF, on_cpu)
    signal.signal(signal.SIGALRM, on_wall)
    signal.setitimer(signal.ITIMER_PROF, cpu_s)
    signal.setitimer(signal.ITIMER_REAL, wall_s)
    return wall_s


def cancel():
    _armed[0] = -abs(_armed[0])  # keeps the count, so a new arm() gets a new generation
    signal.setitimer(signal.ITIMER_PROF, 0)
    signal.setitimer(signal.ITIMER_REAL, 0)
