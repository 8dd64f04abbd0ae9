"""What Ctrl-C (SIGINT) or SIGTERM must undo, and the one handler every command installs.

A command registers what it would leave behind while it makes it: a record to close
(`on_stop`: its MLflow runs, marked KILLED, `kill_run_on_stop`; its Prefect flow run,
marked Crashed, flows/stages.py), a folder to unmount and remove
(`remove_on_stop`: a sandbox's tmpfs workspace, a verifier's work area, a run's temporary
folder). `install(prog)` (the error boundary, components/cli.py `boundary`, calls it in the
main thread) makes SIGINT and SIGTERM, sent to the process or to its process group, do
this, in this order, and end the process at once with 130 (SIGINT) or 143 (SIGTERM):

1. set the process-wide stopping flag (components/runtime.py): worker threads still
   running start no new sandbox, folder or process;
2. close the records (all at once, within 3 s: a tracking server that does not answer
   is not waited for), each failure one line on stderr; MLflow runs opened with
   `mlflow.start_run` (a trainer's, in any thread) are marked KILLED without registering;
3. stop every process this one started (sandboxes, Prefect's server, vLLM, DataLoader
   workers: SIGTERM, then SIGKILL after 0.3 s);
4. unmount and remove the folders (until they stay gone: a copy in flight recreates
   the folders it writes into), release the workdir locks;
5. one line on stderr (`agentrl env eval: interrupted`, `...: terminated`), then
   `os._exit(128 + signal)`.

It ends the process instead of unwinding as an exception: unwinding waits for a thread
pool's queued work (`with ThreadPoolExecutor` joins every queued sandbox) and runs the
`finally` blocks of threads that are being killed. A second signal while this runs is
ignored, so it is not cut short.

Prefect's flow engine replaces the SIGTERM handler with its own while a flow runs in the
main thread (prefect/utilities/engine `capture_sigterm`, skipped outside the main thread:
"Signals only work in the main thread"); it then reports the crash to its API server and
only afterwards hands the signal on. `in_worker_thread` runs a flow in a thread, so this
handler keeps the signal.

    restore = install("agentrl env eval")         # components/cli.py `boundary`
    key = remove_on_stop(root)                     # components/sandbox/workspace.py
    ...                                            # the workspace is used
    remove_root(root); forget(key)                 # removed by its owner: nothing to undo
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

_LOCK = threading.Lock()
_IDS = itertools.count()
_RECORDS: dict[int, tuple[str, Callable[[], None]]] = {}
_FOLDERS: dict[int, Path] = {}
_PROG = ["agentrl"]  # the command named in the line the handler prints


def on_stop(what: str, close: Callable[[], None]) -> int:
    """Call `close` if a signal stops the command (`what` names it in an error line); the
    id for `forget`."""
    with _LOCK:
        key = next(_IDS)
        _RECORDS[key] = (what, close)
    return key


def remove_on_stop(folder: str | Path) -> int:
    """Unmount and remove `folder` if a signal stops the command; the id for `forget`."""
    with _LOCK:
        key = next(_IDS)
        _FOLDERS[key] = Path(folder)
    return key


@contextlib.contextmanager
def temporary_folder(prefix: str) -> Iterator[str]:
    """`tempfile.TemporaryDirectory(prefix=prefix)` that Ctrl-C or SIGTERM removes too (the
    handler's `os._exit` skips the `with`'s own removal)."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        key = remove_on_stop(tmp)
        try:
            yield tmp
        finally:
            forget(key)


def forget(key: int) -> None:
    """The record is closed, or the folder removed, by its owner: nothing left to undo."""
    with _LOCK:
        _RECORDS.pop(key, None)
        _FOLDERS.pop(key, None)


def install(prog: str) -> Callable[[], None]:
    """SIGINT and SIGTERM stop the command as the module says; the function that puts the
    previous handlers back. Only in the main thread, and only a signal still at Python's
    default: one ignored (SIGINT in a background job) stays ignored, one a caller handles
    (an outer command, a test) stays theirs."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    defaults = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}
    saved = {
        sig: signal.signal(sig, _on_signal)
        for sig, default in defaults.items()
        if signal.getsignal(sig) is default
    }
    if saved:
        _PROG[0] = prog

    def restore() -> None:
        for sig, handler in saved.items():
            signal.signal(sig, handler)

    return restore


def handles_signals() -> bool:
    """Whether SIGINT and SIGTERM are this module's in this process (`install` took them):
    a library that would install its own (uvicorn's graceful shutdown) can leave them."""
    return all(signal.getsignal(sig) is _on_signal for sig in (signal.SIGINT, signal.SIGTERM))


def _on_signal(signum: int, frame) -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)  # a second Ctrl-C does not cut the clean-up
    left = stop_everything()
    name = "interrupted" if signum == signal.SIGINT else "terminated"
    said = "; could not remove " + ", ".join(map(str, left)) if left else ""
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    # os.write: a flow's print() goes through Prefect's logging (log_prints)
    os.write(2, f"{_PROG[0]}: {name}{said}\n".encode())
    os._exit(128 + signum)


def stop_everything(budget_s: float = 2.5, record_budget_s: float = 3.0) -> list[Path]:
    """Steps 1-4 of the module's list; the folders that could not be removed. Each record
    are closed together within `record_budget_s` (a tracking server that does not answer
    is not waited for), the folders removed within `budget_s`."""
    from components.runtime import begin_stopping, kill_descendants, remove_until_gone

    begin_stopping()
    with _LOCK:
        records = list(_RECORDS.items())[::-1]
    records.append((-1, ("the MLflow runs started with mlflow.start_run", kill_fluent_runs)))
    _close_all([record for _, record in records], record_budget_s)
    for key, _ in records:
        forget(key)
    # a sandbox's PID-namespace init ignores SIGTERM, and nothing it runs needs a grace
    # period: KILL soon (vLLM's and Prefect's processes are all descendants, KILLed too)
    kill_descendants(grace_s=0.3)
    with _LOCK:
        folders = list(_FOLDERS.items())[::-1]
    each = budget_s / max(len(folders), 1)
    left = []
    for key, folder in folders:
        if remove_until_gone(folder, settle_s=min(0.1, each / 4), budget_s=each):
            forget(key)
        else:
            left.append(folder)
    # os._exit skips the workdir locks' release: released here, the next run finds them
    # free (only a process that imported components/workdir_lock.py can hold one)
    locks = sys.modules.get("components.workdir_lock")
    if locks is not None:
        locks.release_all()
    return left


def _close_all(records: list[tuple[str, Callable[[], None]]], budget_s: float) -> None:
    """Each `close()` in a thread of its own, all at once, waited for `budget_s` together;
    an error or no answer is one line on stderr each."""
    failed: dict[str, str] = {}

    def body(what: str, close: Callable[[], None]) -> None:
        try:
            close()
        except Exception as e:  # noqa: BLE001 - one record that cannot be closed stops none
            failed[what] = type(e).__name__

    threads = []
    for what, close in records:
        context = contextvars.copy_context()  # the caller's settings (Prefect's are context vars)
        thread = threading.Thread(target=context.run, args=(body, what, close), daemon=True)
        thread.start()
        threads.append((what, thread))
    deadline = time.monotonic() + budget_s
    for what, thread in threads:
        thread.join(max(deadline - time.monotonic(), 0.0))
        if thread.is_alive():
            failed[what] = f"no answer within {budget_s:g}s"
    for what, why in failed.items():
        os.write(2, f"{_PROG[0]}: could not close {what}: {why}\n".encode())


def kill_fluent_runs() -> None:
    """Mark KILLED every MLflow run this process started with `mlflow.start_run` and did not
    end (a trainer's run), in any thread: the fluent API keeps one stack per thread, and the
    handler runs in the main one."""
    fluent = sys.modules.get("mlflow.tracking.fluent")
    if fluent is None:  # MLflow not imported: no run
        return
    import mlflow

    stacks = fluent._active_run_stack.get_all_thread_values().values()
    for run in {run.info.run_id: run for stack in stacks for run in stack}.values():
        mlflow.MlflowClient().set_terminated(run.info.run_id, "KILLED")


def kill_run_on_stop(run_id: str) -> int:
    """Mark the MLflow run `run_id` (a pipeline's parent, created with the client API) and
    its RUNNING child runs KILLED if a signal stops the command; the id for `forget`."""
    import mlflow

    uri = mlflow.get_tracking_uri()

    def kill() -> None:
        client = mlflow.MlflowClient(uri)
        experiment = client.get_run(run_id).info.experiment_id
        children = client.search_runs(
            [experiment], f"tags.mlflow.parentRunId = '{run_id}' and attributes.status = 'RUNNING'"
        )
        for run in children:
            client.set_terminated(run.info.run_id, "KILLED")
        client.set_terminated(run_id, "KILLED")

    return on_stop(f"MLflow run {run_id}", kill)


def in_worker_thread(call: Callable[[], object]) -> object:
    """`call()` in a thread of its own, the main thread waiting: a Prefect flow run there
    leaves SIGTERM to `install`'s handler (see the module's note). Its result, or its
    exception re-raised here."""
    outcome: dict[str, object] = {}

    def body() -> None:
        try:
            outcome["value"] = call()
        except BaseException as e:  # noqa: BLE001 - handed to the main thread as it is
            outcome["error"] = e

    # the caller's context vars go with it: Prefect's temporary settings (its API URL) are
    context = contextvars.copy_context()
    thread = threading.Thread(target=context.run, args=(body,), name="agentrl-flow", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(0.5)  # short waits: the main thread runs its signal handlers between
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome.get("value")
