"""Test worker: writes its pid to OUT_DIR/pid<RANK>, then sleeps until it is ended."""

import os
import sys
import time

path = os.path.join(sys.argv[1], f"pid{os.environ['RANK']}")
with open(path + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.replace(path + ".tmp", path)
time.sleep(600)
