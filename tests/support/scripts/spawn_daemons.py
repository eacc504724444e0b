"""Test worker: starts processes that leave the rank's process group and session, as tools' daemons do.

Each rank starts ``sleep 600`` in a session of its own (``start_new_session=True``) and a
double-forked daemon (fork, setsid, fork: its parent exits at once, so it is re-parented away
from the rank), writes their pids to OUT/daemons.<RANK>, then exits 0 once OUT/go exists
(``exit``) or waits to be killed (``block``).

    spawn_daemons.py OUT exit|block
"""

import os
import subprocess
import sys
import time

out, mode = sys.argv[1], sys.argv[2]
rank = os.environ.get("RANK", "0")
session = subprocess.Popen(["sleep", "600"], start_new_session=True)
r, w = os.pipe()
child = os.fork()
if child == 0:  # the classic daemon: fork, setsid, fork again, the middle one exits
    os.close(r)
    os.setsid()
    grandchild = os.fork()
    if grandchild == 0:
        os.execvp("sleep", ["sleep", "600"])
    os.write(w, str(grandchild).encode())
    os._exit(0)
os.close(w)
os.waitpid(child, 0)
daemon = int(os.read(r, 64).decode())
with open(os.path.join(out, f"daemons.{rank}.tmp"), "w") as f:
    f.write(f"{session.pid} {daemon}\n")
os.replace(os.path.join(out, f"daemons.{rank}.tmp"), os.path.join(out, f"daemons.{rank}"))
while mode == "block" or not os.path.exists(os.path.join(out, "go")):
    time.sleep(0.2)
