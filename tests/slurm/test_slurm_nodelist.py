"""Slurm hostlist expansion, checked against the examples in Slurm's documentation."""

import pytest

from numarun.errors import SlurmError
from numarun.jobenv.hostlist import expand_hostlist


@pytest.mark.parametrize(
    "text, hosts",
    [
        ("node1", ["node1"]),
        ("node[01-03,07]", ["node01", "node02", "node03", "node07"]),
        ("a[1-2]b[3-4]", ["a1b3", "a1b4", "a2b3", "a2b4"]),
        ("x,y[9-11]", ["x", "y9", "y10", "y11"]),
        ("gpu-[008-010]", ["gpu-008", "gpu-009", "gpu-010"]),
        ("n[1,3-4],login", ["n1", "n3", "n4", "login"]),
        ("rack[1-2]-n[1]", ["rack1-n1", "rack2-n1"]),
        ("n[5-5]", ["n5"]),
        ("[1-2]x", ["1x", "2x"]),
    ],
)
def test_expand(text, hosts):
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize(
    "text", ["", " ", "n[3-1]", "n[1-2", "n]1", "n[a-b]", "n[1-]", "n[[1]]", "a,,b", "a b", "n[]", "n[-2]"]
)
def test_bad_hostlists_name_the_value(text):
    with pytest.raises(SlurmError) as e:
        expand_hostlist(text)
    assert repr(text) in str(e.value) and "expected" in str(e.value)


def test_huge_range_is_refused_not_allocated():
    with pytest.raises(SlurmError):
        expand_hostlist("n[0-99999999]")
