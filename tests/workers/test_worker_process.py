"""A worker's process ends as soon as its worker has stopped, without losing what it wrote."""

import subprocess
import sys

SCRIPT = """
import atexit, logging, sys
from edgetrain.workers.processes.celery_worker import end_process
logging.basicConfig(filename=sys.argv[1], format="%(message)s")
atexit.register(lambda: print("exit hook ran"))
logging.warning("the last log line")
print("buffered output", end="")
sys.stderr.write("buffered error")
end_process(3)
print("never here")
"""


def test_end_process_runs_the_exit_hooks_flushes_logs_and_output_and_keeps_the_status(tmp) -> None:
    log = tmp / "worker.log"
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(log)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr
    assert done.stdout == "buffered outputexit hook ran\n"
    assert done.stderr == "buffered error"
    assert log.read_text() == "the last log line\n"
