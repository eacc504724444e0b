"""Test worker: starts three short-lived daemons (fork, setsid, fork: each is re-parented away from the
rank), waits until each has exited and been reaped by whoever inherited it (a zombie keeps its /proc
entry), writes OUT/reaped.<RANK>, then exits 0 once OUT/go exists.

    short_daemons.py OUT
"""

import os
import sys
import time

out, rank = sys.argv[1], os.environ["RANK"]
daemons = []
for _ in range(3):
    r, w = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(r)
        os.setsid()
        grandchild = os.fork()
        if grandchild == 0:
            os.execvp("sleep", ["sleep", "0.2"])
        os.write(w, str(grandchild).encode())
        os._exit(0)
    os.close(w)
    os.waitpid(child, 0)
    daemons.append(int(os.read(r, 64)))
    os.close(r)
while any(os.path.exists(f"/proc/{pid}") for pid in daemons):
    time.sleep(0.05)
open(os.path.join(out, f"reaped.{rank}"), "w").close()
while not os.path.exists(os.path.join(out, "go")):
    time.sleep(0.05)
