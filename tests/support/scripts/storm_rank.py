"""Test worker for the signal storm: marks OUT/started.<RANK>, then runs until SIGTERM and exits 0 (a
clean stop). The counting is ``signal_counter/sitecustomize.py``'s, from the interpreter's start.

    storm_rank.py OUT
"""

import os
import sys

import sitecustomize

open(os.path.join(sys.argv[1], f"started.{os.environ['RANK']}"), "w").close()
sitecustomize.STOP.wait()
