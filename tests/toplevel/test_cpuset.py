"""cpulist / cpumask parsing: the kernel's forms and the bad inputs users paste."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from numarun.cpuset import format_list, parse_list, parse_mask
from numarun.errors import CpuListError, NumarunError


@pytest.mark.parametrize(
    "text, ids",
    [
        ("", ()),
        ("0", (0,)),
        ("0-3,8", (0, 1, 2, 3, 8)),
        (" 0-1 , 4 \n", (0, 1, 4)),
        ("64-127,192-254", tuple(range(64, 128)) + tuple(range(192, 255))),
        ("0-9:2/5", (0, 1, 5, 6)),  # bitmap_parselist stride form
        ("8,0,0", (0, 8)),
    ],
)
def test_parse_list(text, ids):
    assert parse_list(text) == ids


@pytest.mark.parametrize("text", ["3-1", "a-b", "-1", "1-", "1,,2", "0x3", "1-2-3", "99999999", "0-9:0/5", "0-9:3/2"])
def test_parse_list_rejects_with_value_and_form(text):
    with pytest.raises(CpuListError) as e:
        parse_list(text)
    assert repr(text.strip()) in str(e.value)
    assert "expected" in str(e.value)
    assert isinstance(e.value, NumarunError)


@pytest.mark.parametrize(
    "ids, text",
    [((), ""), ((0,), "0"), ((0, 1, 2, 3, 8), "0-3,8"), ((1, 3, 5), "1,3,5"), ((5, 4, 3), "3-5")],
)
def test_format_list(ids, text):
    assert format_list(ids) == text


@given(st.sets(st.integers(min_value=0, max_value=4095)))
def test_list_round_trip(ids):
    assert parse_list(format_list(ids)) == tuple(sorted(ids))


@given(st.sets(st.integers(min_value=0, max_value=1023)))
def test_mask_round_trip(ids):
    assert parse_mask(f"{sum(1 << i for i in ids):x}") == tuple(sorted(ids))


def test_mask_kernel_examples():
    # sysfs cpumap of aws p4d NUMA 0: CPUs 0-23 and 48-71
    assert parse_mask("000000ff,ffff0000,00ffffff") == tuple(range(24)) + tuple(range(48, 72))
    assert parse_mask("000000ff") == tuple(range(8))
    assert parse_mask("00000000") == ()
    assert parse_mask("0x3") == (0, 1)


@pytest.mark.parametrize("text", ["zz", "ff,,g0"])
def test_mask_rejects(text):
    with pytest.raises(CpuListError):
        parse_mask(text)
