"""Launching: the plan handed to torchrun (``torchrun.py``), the worker side that applies
a rank's binding before the user's code (``bootstrap.py``) and the system calls it uses
(``affinity.py``). Importing this package does not import torch."""
