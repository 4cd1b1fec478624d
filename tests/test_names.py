import pytest

from tierfs.contracts import names
from tierfs.contracts.errors import InvalidNameError


@pytest.mark.parametrize(
    "raw, expected",
    [("a", "a"), ("/a/b", "a/b"), ("a/b/", "a/b"), ("x y/ü.log", "x y/ü.log")],
)
def test_canonical_accepts(raw: str, expected: str) -> None:
    assert names.canonical(raw) == expected


@pytest.mark.parametrize(
    "raw",
    ["", "/", "a//b", "../a", "a/..", "a/./b", ".", "a\x00b", "x" * 256, "a/" + "é" * 128, "//a"],
)
def test_canonical_rejects(raw: str) -> None:
    with pytest.raises(InvalidNameError):
        names.canonical(raw)


def test_root_only_where_allowed() -> None:
    assert names.canonical("/", allow_root=True) == ""
    assert names.canonical("", allow_root=True) == ""


def test_component_of_exactly_255_bytes_is_fine() -> None:
    assert names.canonical("x" * 255) == "x" * 255


def test_non_string_is_rejected() -> None:
    with pytest.raises(InvalidNameError):
        names.canonical(b"abc")  # type: ignore[arg-type]


def test_parent_and_within() -> None:
    assert names.parent_of("a/b/c") == "a/b"
    assert names.parent_of("a") == ""
    assert names.is_within("a/b", "a")
    assert not names.is_within("ab", "a")
    assert names.is_within("a", "")
