"""env/sandbox/triton_key.py: a child's record names where two keys' parts differ, also when
they agree for their first lines (an assembler's version text)."""

from kernelrl.env.sandbox.triton_key import differences

VERSION = (
    "ptxas: NVIDIA (R) Ptx optimizing assembler\nCopyright (c) 2005-2025 NVIDIA Corporation\n"
    "Built on {built}\nCuda compilation tools, release {release}\n-90"
)


def test_a_long_part_is_shown_from_where_it_differs() -> None:
    here = {"hash": "a", "backend": VERSION.format(built="Fri_Feb_21", release="12.8, V12.8.93")}
    there = {"hash": "b", "backend": VERSION.format(built="Wed_Aug_20", release="13.0, V13.0.88")}
    said = differences(here, there)
    assert said.startswith("backend (..."), said
    assert "Fri_Feb_21 Cuda compilation tools, release 12.8" in said, said
    assert "Wed_Aug_20 Cuda compilation tools, release 13.0" in said, said
    assert "\n" not in said


def test_short_parts_are_shown_whole_and_the_hash_only_when_nothing_else_differs() -> None:
    assert differences({"hash": "a", "o": "4"}, {"hash": "b", "o": "8"}) == "o (4 here, 8 there)"
    assert differences({"hash": "a"}, {"hash": "b"}) == "hash (a here, b there)"
    assert differences({"hash": "a"}, None) == "the companion sent no key parts"
