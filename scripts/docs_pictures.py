"""Draw the documentation's pictures (docs/img/*.svg) from recorded machines, with numarun's own commands.

    .venv/bin/python scripts/docs_pictures.py            # rewrite docs/img/
    .venv/bin/python scripts/docs_pictures.py --check    # exit 1 naming each picture that is not current

Each machine gives two pictures: ``<name>-topo.svg`` (``numarun topo --svg``) and ``<name>-plan.svg``
(``numarun plan --svg`` with the machine's plan options); each recorded job of :data:`STEP_JOBS` the step report's
picture of its steps. A machine is one line of :data:`MACHINES`;
tests/docs/test_docs_pictures.py runs ``--check``'s comparison, so a change in what numarun draws shows up
as a picture to regenerate.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
IMG = REPO / "docs" / "img"


@dataclass(frozen=True)
class Machine:
    name: str
    topology: str
    """A recorded topology, relative to the repository (the pictures name it as given)."""
    plan: tuple[str, ...] = ()
    """Options of ``numarun plan`` for the plan picture."""
    env: tuple[tuple[str, str], ...] = ()
    """Variables set while drawing (a scheduler's ``CUDA_VISIBLE_DEVICES``)."""


MACHINES = (
    # NUMA-bound ranks: 8 GPUs on 4 of 8 NUMA nodes, NVSwitch, two rails per switch, two storage NICs
    Machine("dgx-a100", "tests/fixtures/nvidia-smi/dgx-a100-8numa-nps4-10nic.txt"),
    # a layout: an 8-GPU PCIe box handed over out of order, tp's pairs put back on their switches (docs/layouts.md)
    Machine(
        "pcie-8gpu-mesh",
        "tests/fixtures/nvidia-smi/pcie-8gpu-pix-phb-sys-2x14c.txt",
        plan=("--mesh", "dp_shard=4,tp=2"),
        env=(("CUDA_VISIBLE_DEVICES", "0,4,2,6,1,5,3,7"),),
    ),
)


def _numarun(argv: list[str]) -> None:
    from numarun.cli import main

    with contextlib.redirect_stdout(io.StringIO()) as out:
        code = main(argv)
    if code != 0:
        raise SystemExit(f"numarun {' '.join(argv)} exited {code}: {out.getvalue()}")


@contextlib.contextmanager
def _environment(env: tuple[tuple[str, str], ...]):  # type: ignore[no-untyped-def]
    saved = {k: os.environ.get(k) for k, _ in env}
    os.environ.update(dict(env))
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def draw(machine: Machine, into: Path) -> dict[str, str]:
    """name of the picture -> its SVG text, drawn into the folder ``into``."""
    pictures = {}
    for kind, argv in (
        ("topo", ["topo", "--topology", machine.topology]),
        ("plan", ["plan", "--topology", machine.topology, *machine.plan]),
    ):
        path = into / f"{machine.name}-{kind}.svg"
        with _environment(machine.env):
            _numarun([*argv, "--svg", str(path)])
        pictures[path.name] = path.read_text(encoding="utf-8")
    return pictures


STEP_JOBS = (
    # the step report's picture of a real job: rank 1's core shared with a spinner (tests/e2e/test_steps_jobs.py's)
    ("steps-shared-core", "tests/fixtures/steps/shared-core-job"),
)
"""(picture name, a folder holding a job's ``steps.jsonl`` and its ranks' ``places.json``)."""


def draw_steps(folder: str) -> str:
    """The step report's picture (:func:`numarun.view.steps_picture.picture`) of a recorded job."""
    import json

    from numarun.jsonable import from_jsonable
    from numarun.view.steps_picture import picture
    from numarun.worker.steps import RankPlace, read_records

    records = list(read_records((REPO / folder / "steps.jsonl").read_text().splitlines()))
    places = [from_jsonable(RankPlace, p) for p in json.loads((REPO / folder / "places.json").read_text())]
    return picture(records, {p.rank: p for p in places})


def draw_all() -> dict[str, str]:
    with tempfile.TemporaryDirectory() as tmp:
        pictures: dict[str, str] = {}
        for machine in MACHINES:
            pictures.update(draw(machine, Path(tmp)))
        pictures.update((f"{name}.svg", draw_steps(folder)) for name, folder in STEP_JOBS)
        return pictures


def stale(pictures: dict[str, str], img: Path = IMG) -> list[str]:
    """The pictures whose file under ``img`` is missing or differs, and files there no machine draws."""
    out = [
        name
        for name, svg in pictures.items()
        if not (img / name).exists() or (img / name).read_text(encoding="utf-8") != svg
    ]
    out += [p.name for p in sorted(img.glob("*.svg")) if p.name not in pictures]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say which pictures are not current (exit 1)")
    args = parser.parse_args()
    import os

    os.chdir(REPO)  # the pictures name their topology source as given, relative to the repository
    pictures = draw_all()
    if args.check:
        names = stale(pictures)
        for name in names:
            print(f"docs/img/{name}: not current (run scripts/docs_pictures.py)", file=sys.stderr)
        return 1 if names else 0
    IMG.mkdir(parents=True, exist_ok=True)
    for name, svg in pictures.items():
        (IMG / name).write_text(svg, encoding="utf-8")
    for name in stale(pictures):
        (IMG / name).unlink()
    print(f"wrote {len(pictures)} pictures to {IMG.relative_to(REPO)}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
