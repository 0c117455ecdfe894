"""The watch thread of a rank worker / engine core process: when the parent's end of the
stdin pipe closes (the parent stopped or died), the child exits on its own."""

import subprocess
import sys

CHILD = """
import threading, time
from stator.engines.native.rank_worker import exit_when_parent_is_gone
threading.Thread(target=exit_when_parent_is_gone, daemon=True).start()
print("watching", flush=True)
time.sleep(600)
"""


def test_child_exits_when_the_parents_pipe_closes():
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline().strip() == "watching"
        child.stdin.write("data the watcher must read past\n" * 1000)
        child.stdin.flush()
        assert child.poll() is None  # data alone does not end it
        child.stdin.close()
        assert child.wait(timeout=60) == 0
    finally:
        child.kill()
        child.wait()
