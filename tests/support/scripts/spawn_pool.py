"""Test worker: a spawn-context pool pickling a class defined in __main__ (needs a real __main__)."""

import multiprocessing as mp


class Box:
    def __init__(self, x: int) -> None:
        self.x = x


def double(box: Box) -> int:
    return box.x * 2


if __name__ == "__main__":
    with mp.get_context("spawn").Pool(1) as pool:
        print(pool.map(double, [Box(1), Box(2)]))
