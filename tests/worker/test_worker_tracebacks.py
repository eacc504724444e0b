"""A traceback from the user's program starts at the user's code: none of numarun's frames (the
worker's entry and bootstrap, runpy's, importlib's), whatever raised and however it was run."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import clean_env

import numarun

pytestmark = pytest.mark.slow  # every test starts a worker

ENTRY = Path(numarun.__file__).parent / "worker" / "entry.py"
OURS = re.compile(r"runpy|importlib\._bootstrap|" + re.escape(str(Path(numarun.__file__).parent)))

FILES = {
    "direct.py": "raise ValueError('direct')\n",
    "helper.py": "def boom():\n    raise ValueError('in helper')\n",
    "bad_import.py": "raise ValueError('at import')\n",
    "imports.py": "import bad_import\n",
    "calls.py": "import helper\nhelper.boom()\n",
    "chained.py": "import helper\ntry:\n    helper.boom()\nexcept ValueError as e:\n    raise RuntimeError('wrapped') "
    "from e\n",
    "during.py": "try:\n    {}['k']\nexcept KeyError:\n    import helper\n    helper.boom()\n",
    "base.py": "class Stop(BaseException):\n    pass\n\nraise Stop('base')\n",
    "hooked.py": "import sys\nsys.excepthook = lambda t, e, tb: print('HOOK', t.__name__, "
    "tb.tb_frame.f_code.co_filename)\n"
    "raise ValueError('hooked')\n",
    "pkg/__init__.py": "",
    "pkg/mod.py": "raise ValueError('in -m')\n",
    "pkg/imports.py": "import bad_import\n",
}

# target -> (the first frame's file, the last line), as 'python TARGET' / 'python -m TARGET' print them
CASES = {
    "direct.py": ("direct.py", "ValueError: direct"),
    "imports.py": ("imports.py", "ValueError: at import"),
    "calls.py": ("calls.py", "ValueError: in helper"),
    "chained.py": ("chained.py", "RuntimeError: wrapped"),
    "during.py": ("during.py", "ValueError: in helper"),
    "base.py": ("base.py", "Stop: base"),
    "-m pkg.mod": ("pkg/mod.py", "ValueError: in -m"),
    "-m pkg.imports": ("pkg/imports.py", "ValueError: at import"),
}


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("programs")
    for rel, text in FILES.items():
        (d / rel).parent.mkdir(exist_ok=True)
        (d / rel).write_text(text)
    return d


def _worker(cwd: Path, *target: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ENTRY), *target], cwd=cwd, env=clean_env(), capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("target", list(CASES))
def test_the_traceback_starts_at_the_users_code(programs: Path, target: str) -> None:
    r = _worker(programs, *(["--module", target[3:]] if target.startswith("-m ") else [target]))
    first, last = CASES[target]
    assert r.returncode == 1, r.stderr
    assert not [line for line in r.stderr.splitlines() if OURS.search(line)], r.stderr
    tracebacks = [i for i, line in enumerate(r.stderr.splitlines()) if line == "Traceback (most recent call last):"]
    assert len(tracebacks) == (2 if target in ("chained.py", "during.py") else 1), r.stderr
    lines = r.stderr.splitlines()
    assert lines[tracebacks[0] + 1].startswith(f'  File "{programs / first}"'), r.stderr
    assert lines[-1] == last, r.stderr


def test_the_users_excepthook_gets_the_users_frames(programs: Path) -> None:
    r = _worker(programs, "hooked.py")
    assert (
        r.returncode == 1 and r.stderr.strip() == "" and r.stdout.strip() == f"HOOK ValueError {programs / 'hooked.py'}"
    ), r
