"""The file torchrun runs in every worker, by path: ``python -u <numarun>/worker/entry.py ARGS``.

Run by path and not as ``python -m numarun.worker.bootstrap``: ``-m`` puts the working
directory first on ``sys.path``, so a user's folder named ``numarun`` (or anything on
``PYTHONPATH``) would be imported instead of the installed package and every worker would
fail. This file loads the package from the folder it sits in, registers it as
``numarun`` before anything else can, gives ``sys.path[0]`` the value ``python -m`` would
have given it (the working directory), then hands over to the bootstrap.

It imports only the standard library before that: it runs as ``__main__``, outside the package.
"""

import importlib.util
import os
import sys


def _load_numarun() -> None:
    package_dir = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    # Python put this file's folder first on sys.path; a module of ours must not be
    # importable by its bare name there. 'python -m' would have put the cwd.
    sys.path[0] = os.getcwd()
    spec = importlib.util.spec_from_file_location(
        "numarun", os.path.join(package_dir, "__init__.py"), submodule_search_locations=[package_dir]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["numarun"] = module
    spec.loader.exec_module(module)


if __name__ == "__main__":
    _load_numarun()
    from numarun.worker.bootstrap import main

    main()
