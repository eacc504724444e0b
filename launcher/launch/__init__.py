"""Launching: the plan handed to torchrun (``torchrun.py``) under numarun's supervisor. What runs
inside a rank lives in :mod:`numarun.worker`. Importing this package does not import torch."""
