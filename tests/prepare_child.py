"""``omnipack prepare`` in a child process that starts in a second, not in the seconds an interpreter takes to
import torch and transformers: children are forked from one server process (multiprocessing's forkserver)
that imported the prepare stack once for the whole test session. Each child is a process of its own (its
own pid, environment, stdout and stderr; a SIGKILL kills it alone, leaving what a killed ``omnipack
prepare`` leaves), running the command line's ``main`` with the command's arguments, as ``python -m
omnipack`` does."""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
from pathlib import Path

# Imported once in the server (what a prepare imports beyond ``omnipack.cli``: the tokenizer's transformers
# and torch, the measure tables' pandas), so that no child imports them again.
WARM = ["omnipack.cli", "torch", "transformers.models.auto.tokenization_auto", "pandas", "PIL.Image"]

_context: mp.context.BaseContext | None = None


def warm_context() -> mp.context.BaseContext:
    """The multiprocessing context whose processes fork from the warm server (torch, transformers and the
    prepare stack imported): a process of its own that starts without importing them again."""
    return _forkserver()


def _forkserver() -> mp.context.BaseContext:
    global _context
    if _context is None:
        _context = mp.get_context("forkserver")
        _context.set_forkserver_preload(WARM)
    return _context


def _child_io(env: dict[str, str], stdout: str, stderr: str) -> None:
    """The child's environment and output files, as a fresh process started with them would have."""
    os.environ.clear()
    os.environ.update(env)
    for fd, path in ((1, stdout), (2, stderr)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(target, fd)
        os.close(target)


def _run_cli(argv: list[str], env: dict[str, str], stdout: str, stderr: str) -> None:
    """The child: the command's environment and output files, then ``python -m omnipack ARGV``."""
    _child_io(env, stdout, stderr)
    from omnipack.cli import main

    sys.exit(main(argv))  # its code is the child's exit code; an exception's traceback goes to stderr, code 1


def _run_code(code: str, args: list[str], env: dict[str, str], stdout: str, stderr: str) -> None:
    """The child: the environment and output files, then ``python -c CODE ARGS``."""
    _child_io(env, stdout, stderr)
    sys.argv = ["-c", *args]
    exec(compile(code, "<string>", "exec"), {"__name__": "__main__"})


def _run_child(target, args: tuple, command: list[str], timeout: float) -> subprocess.CompletedProcess:
    """``target(*args, stdout, stderr)`` in a child forked from the warm server: its exit code (``-9`` when it
    was killed with SIGKILL), stdout and stderr."""
    with tempfile.TemporaryDirectory(prefix="omnipack-child-") as tmp:
        out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
        child = _forkserver().Process(target=target, args=(*args, str(out), str(err)))
        child.start()
        child.join(timeout)
        if child.exitcode is None:
            child.kill()
            child.join()
            raise subprocess.TimeoutExpired(command, timeout, out.read_text(), err.read_text())
        return subprocess.CompletedProcess(
            command, child.exitcode, out.read_text(errors="replace"), err.read_text(errors="replace")
        )


def run_omnipack(argv: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """``python -m omnipack ARGV`` with environment ``env`` in a child forked from the warm server: its exit
    code (``-9`` when it was killed with SIGKILL), stdout and stderr."""
    return _run_child(_run_cli, (argv, env), ["omnipack", *argv], timeout)


def run_python(code: str, args: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """``python -c CODE ARGS`` with environment ``env`` in a child forked from the warm server (the prepare
    stack already imported): its exit code, stdout and stderr."""
    return _run_child(_run_code, (code, args, env), ["python", "-c", "<code>", *args], timeout)
