"""Run a command and write its peak RSS to a file: python -S spawn.py RESULT_FILE COMMAND [ARGS...]

Why a launcher: Linux counts the pre-exec memory of a forked child in its
ru_maxrss, and that memory is the parent's. The bench process holds tens of MB
of test data, so children forked straight from it would all report at least
that much. This launcher is a bare interpreter (a few MB); the command is
spawned from it (posix_spawn: no copy of anything big), waited for with
wait4(), and its own ru_maxrss, in bytes, is written to RESULT_FILE. The exit
status is passed on; stdin, stdout and stderr are inherited.
"""

import os
import sys

result_file, command = sys.argv[1], sys.argv[2:]
pid = os.posix_spawnp(command[0], command, os.environ)
_, status, usage = os.wait4(pid, 0)
with open(result_file, "w") as file:
    file.write(str(usage.ru_maxrss * 1024))  # Linux reports KiB
sys.exit(os.waitstatus_to_exitcode(status))
