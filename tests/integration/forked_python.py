"""``python -c CODE ARGS`` for megatron-core's model builds, without starting torch and megatron-core each time.

The integration tests build megatron-core models in a process of their own (a one-process gloo group,
``parallel_state`` and stand-ins such as ``torch.cuda.current_device`` patched for that process alone). A
fresh ``python -c`` spends about 7 CPU s importing torch and megatron-core before it builds anything (a
GPT model build, h28b, 2026-12-02). :func:`run_python` runs the same script in a child forked from one
server per test process that imported them once (:data:`PRELOADED`): the child starts with no process
group, no parallel state and no patch, as a fresh interpreter would, runs ``CODE`` as ``__main__`` with
``sys.argv[1:]`` = ``ARGS`` in ``cwd``, and its exit code, stdout and stderr come back as from
``subprocess.run(..., capture_output=True, text=True)``.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

__all__ = ["PRELOADED", "run_python", "run_pythons"]

PRELOADED = (
    "torch",
    "torch.distributed",
    "megatron.core.parallel_state",
    "megatron.core.transformer.transformer_config",
    "megatron.core.models.gpt.gpt_layer_specs",
    "megatron.core.models.gpt.gpt_model",
)
"""What the server imports before it forks: what every build script imports first."""

_SERVER = r"""
import json, os, sys, tempfile, traceback, warnings
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # each child imports what it uses again and prints its own warnings
    for name in sys.argv[1:]:
        __import__(name)
reply = os.fdopen(os.dup(1), "w")
def start(job, args):
    outputs = [tempfile.mkstemp(prefix="forked_python_") for _ in range(2)]
    sys.stdout.flush(); sys.stderr.flush()
    child = os.fork()
    if child == 0:
        code = 1
        try:
            os.chdir(job["cwd"])
            for fd, (handle, _) in zip((1, 2), outputs):
                os.dup2(handle, fd)
            sys.argv = ["-c", *args]
            exec(compile(job["code"], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
            code = 0
        except SystemExit as done:
            code = 0 if done.code is None else done.code if isinstance(done.code, int) else 1
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush(); sys.stderr.flush()
            os._exit(code)
    return child, outputs
def finish(child, outputs):
    _, status = os.waitpid(child, 0)
    texts = []
    for handle, path in outputs:
        os.close(handle)
        with open(path, errors="replace") as text:
            texts.append(text.read())
        os.unlink(path)
    return {"returncode": os.waitstatus_to_exitcode(status), "stdout": texts[0], "stderr": texts[1]}
for line in sys.stdin:
    job = json.loads(line)
    children = [start(job, args) for args in job["runs"]]  # all at once: they may talk to each other
    reply.write(json.dumps([finish(*child) for child in children]) + "\n")
    reply.flush()
"""

_lock = threading.Lock()
_server: dict[str, object] = {}


def _start() -> subprocess.Popen:
    """The server of this process (started on first use, stopped at exit)."""
    if "process" not in _server:
        log = tempfile.TemporaryFile()
        process = subprocess.Popen([sys.executable, "-c", _SERVER, *PRELOADED], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True)
        _server.update(process=process, log=log)
        atexit.register(_stop)
    return _server["process"]  # type: ignore[return-value]


def _stop() -> None:
    process = _server.pop("process", None)
    if process is not None:
        process.stdin.close()  # type: ignore[union-attr]
        try:
            process.wait(timeout=30)  # type: ignore[union-attr]
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)  # type: ignore[union-attr]


def _server_log() -> str:
    log = _server.get("log")
    if log is None:
        return ""
    log.seek(0)  # type: ignore[union-attr]
    return log.read().decode(errors="replace")[-3000:]  # type: ignore[union-attr]


def run_python(code: str, *args: str, cwd: str | Path, timeout: float) -> subprocess.CompletedProcess:
    """``subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, capture_output=True, text=True,
    timeout=timeout)``, run in a child of the server (module docstring)."""
    return run_pythons(code, [args], cwd=cwd, timeout=timeout)[0]


def run_pythons(code: str, runs: list, *, cwd: str | Path, timeout: float) -> list[subprocess.CompletedProcess]:
    """:func:`run_python` of ``code`` once per argument list of ``runs``, the children started together (the
    ranks of one process group) and each one's result, in order. Raises :class:`subprocess.TimeoutExpired`
    after ``timeout`` seconds (the server and its children are killed), :class:`RuntimeError` when the
    server died."""
    runs = [[str(a) for a in args] for args in runs]
    with _lock:
        process = _start()
        process.stdin.write(json.dumps({"code": code, "runs": runs, "cwd": str(cwd)}) + "\n")  # type: ignore[union-attr]
        process.stdin.flush()  # type: ignore[union-attr]
        ready, _, _ = select.select([process.stdout], [], [], timeout)
        if not ready:
            os.killpg(process.pid, signal.SIGKILL)
            _server.pop("process", None)
            raise subprocess.TimeoutExpired([sys.executable, "-c", "<code>"], timeout)
        line = process.stdout.readline()  # type: ignore[union-attr]
        if not line:
            _server.pop("process", None)
            raise RuntimeError(f"the forked-python server exited ({process.wait()}): {_server_log()}")
    return [subprocess.CompletedProcess([sys.executable, "-c", "<code>", *args], done["returncode"], done["stdout"],
                                        done["stderr"]) for args, done in zip(runs, json.loads(line))]
