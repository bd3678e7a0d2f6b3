"""Starts the programs under test warm: `python agent.py args`, minus the import of the SDK.

Every program imports `openai` when it starts, and that import is half a second of processor
time: 84% of what the suite cost, over some 2,300 starts. This server imports it once, then
for each run it is asked for forks a child that runs the program's file as `__main__`, the
way `python program args` does. The child is a process of its own, in a session of its own,
with the test's working directory, environment, umask and pipes, over real HTTP through the
real SDK; the import it skips is a module the interpreter had already loaded.

What a fresh interpreter reads at start (the locale, PYTHON* variables, HOME's user site) is
read here, from the hermetic environment the server starts with; conftest.run_agent starts
cold any run whose environment differs in one of them, or that asks for another interpreter,
a terminal or options of its own. test_layout starts every program cold.

Protocol, over the Unix packet socket passed as argv[1]: a request is one JSON packet (argv,
cwd, env, umask) sent with three descriptors (stdin, stdout, stderr); the answer is a packet
with the child's pid, then, once it has ended, one with its exit status as subprocess has it.
"""

import atexit
import json
import os
import runpy
import signal
import socket
import sys
import threading

import openai  # noqa: F401  the half second every child is spared

REQUEST_LIMIT = 1 << 16  # conftest starts cold a run whose request is longer


def exit_status(error: SystemExit) -> int:
    """What the interpreter makes of sys.exit(x): None is 0, a number is itself, anything
    else is printed to stderr and is 1."""
    if error.code is None:
        return 0
    if isinstance(error.code, int):
        return error.code
    print(error.code, file=sys.stderr)
    return 1


def print_uncaught(error: BaseException, program: str) -> None:
    """The traceback the interpreter prints, from the program's first frame: this file's and
    runpy's are not the program's."""
    frames = error.__traceback__
    while frames is not None and frames.tb_frame.f_code.co_filename != program:
        frames = frames.tb_next
    if frames is not None:
        error.__traceback__ = frames  # 3.12+ prints the exception's own, whatever excepthook is given
    sys.excepthook(type(error), error, error.__traceback__)


def run_child(request: dict, descriptors: list[int], control: socket.socket) -> None:
    """In the forked child: become the program, then end the way the interpreter ends."""
    control.close()
    os.setsid()
    for target, descriptor in enumerate(descriptors):
        os.dup2(descriptor, target)  # sys.stdin/stdout/stderr are the same objects over new files
    for descriptor in descriptors:
        os.close(descriptor)
    os.chdir(request["cwd"])
    if "tempfile" in sys.modules:  # it caches the directory it chose; the child's TMPDIR decides
        sys.modules["tempfile"].tempdir = None
    os.umask(request["umask"])
    os.environ.clear()
    os.environ.update(request["env"])
    program = request["argv"][0]
    sys.argv = list(request["argv"])
    sys.path[0] = os.path.dirname(os.path.abspath(program))
    status, interrupted = 0, False
    try:
        runpy.run_path(program, run_name="__main__")
    except SystemExit as error:
        status = exit_status(error)
    except KeyboardInterrupt as error:
        print_uncaught(error, program)
        interrupted = True
    except BaseException as error:
        print_uncaught(error, program)
        status = 1
    # Py_FinalizeEx's order: wait for non-daemon threads, run atexit, flush the standard files.
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            status = status or 120  # what the interpreter returns when the flush fails
    if interrupted:  # an uncaught Ctrl-C ends the process by SIGINT, as the interpreter does
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(status)


def serve(control: socket.socket) -> None:
    while True:
        message, descriptors, _, _ = socket.recv_fds(control, REQUEST_LIMIT, 3)
        if not message:
            return
        request = json.loads(message)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            try:
                run_child(request, descriptors, control)
            finally:
                os._exit(1)
        for descriptor in descriptors:
            os.close(descriptor)
        control.send(json.dumps({"pid": pid}).encode())
        _, wait_status = os.waitpid(pid, 0)
        control.send(json.dumps({"status": os.waitstatus_to_exitcode(wait_status)}).encode())


if __name__ == "__main__":
    serve(socket.socket(fileno=int(sys.argv[1])))
