"""Test worker: the rank named by argv[1] exits with code argv[2]; the others exit 0."""

import os
import sys

if os.environ["RANK"] == sys.argv[1]:
    sys.exit(int(sys.argv[2]))
