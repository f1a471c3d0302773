"""The command line's process ends after its exit handlers and with its output flushed, without
Python's teardown of every module; with another thread still running, as Python ends it."""

from __future__ import annotations

import os
import subprocess
import sys

PROBE = """
import atexit, os, sys, threading, time
from run_otel.cli.process_end import end_process

class Teardown:
    def __del__(self, write=os.write):
        write(2, b"teardown\\n")

kept = Teardown()  # freed only by Python's teardown of this module
atexit.register(lambda: sys.stderr.write("exit handler ran\\n"))
assert not sys.stdout.write_through  # the precondition: a pipe is block-buffered, ...
print("the command's output")  # ... so this is still in the buffer when the process ends
if sys.argv[2] == "thread":
    threading.Thread(target=lambda: (time.sleep(0.3), print("the other thread finished"))).start()
end_process(eval(sys.argv[1]))
"""


def _end(code: str, thread: str = "") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    return subprocess.run([sys.executable, "-c", PROBE, code, thread], capture_output=True, text=True, timeout=60, env=env)


def test_a_command_ends_after_its_exit_handlers_with_its_output_and_without_teardown():
    done = _end("3")
    assert done.returncode == 3
    assert done.stdout == "the command's output\n"
    assert "exit handler ran" in done.stderr
    assert "teardown" not in done.stderr


def test_the_codes_system_exit_gives_end_it_alike():
    assert _end("None").returncode == 0
    done = _end("'run-otel: stopped'")
    assert (done.returncode, done.stderr.splitlines()[0]) == (1, "run-otel: stopped")


def test_with_another_thread_running_python_ends_the_process_and_waits_for_it():
    done = _end("0", "thread")
    assert done.returncode == 0
    assert done.stdout == "the command's output\nthe other thread finished\n"
    assert "teardown" in done.stderr  # the precondition: this is Python's own end
