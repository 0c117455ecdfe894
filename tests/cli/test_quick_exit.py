"""`QuickExit`: a serving process ends with its code once the other exit callbacks have
run, skipping the interpreter's teardown of its modules; one that did not end normally
exits the ordinary way."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.procs import REPO, repo_env

SCRIPT = textwrap.dedent(
    """
    import atexit, logging, sys
    from stator.cli.quick_exit import QuickExit

    quick = QuickExit.install()
    logging.basicConfig(stream=sys.stderr, level=logging.INFO)
    atexit.register(sys.stdout.write, "later callback ran")  # left in the buffer

    class Teardown:
        def __del__(self):
            print("module teardown ran", flush=True)

    kept = Teardown()  # freed only by the interpreter's teardown
    logging.getLogger("t").info("logged before exit")
    if sys.argv[1] == "arm":
        quick.arm(3)
    sys.exit(5)
    """
)


def run(mode: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, mode],
        env=repo_env(PYTHONUNBUFFERED=""),  # stdout block-buffered, as into a file
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_armed_exit_runs_callbacks_flushes_and_skips_teardown():
    done = run("arm")
    assert done.returncode == 3, done.stderr
    assert done.stdout == "later callback ran"
    assert "logged before exit" in done.stderr
    assert "module teardown ran" not in done.stdout


def test_unarmed_exit_is_the_interpreters():
    done = run("no")
    assert done.returncode == 5, done.stderr
    assert "later callback ran" in done.stdout
    assert "module teardown ran" in done.stdout
    assert "logged before exit" in done.stderr
