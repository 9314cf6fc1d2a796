import uuid

import pytest

from idempotency.keys import IdemKey, InvalidKey


@pytest.mark.parametrize(
    "raw, value",
    [
        ("abc", "abc"),
        ("  abc\t", "abc"),
        ('"abc"', "abc"),
        ('"a \\"quoted\\" \\\\ key"', 'a "quoted" \\ key'),
        ("a" * 255, "a" * 255),
        ("~!@#$%^&*()", "~!@#$%^&*()"),
        ('"order-1";origin=app', "order-1"),  # an RFC 8941 Item: its parameters are not the key
        ('"order-1"; origin="a;b"; v=2; ok=?1; t=tok/en; n=-1.5; bin=:aGk=:; flag', "order-1"),
    ],
)
def test_parse_accepts_tokens_and_rfc8941_strings(raw, value):
    assert IdemKey.parse(raw).value == value


@pytest.mark.parametrize(
    "raw",
    [
        "",
        "   ",
        '""',
        "a" * 256,
        "caf\u00e9",
        "tab\tinside",
        "nul\x00",
        '"unterminated',
        '"bad \\n escape"',
        '"inner " quote"',
        "\x7f",
        '"abc"trailing',
        '"abc";Upper=1',
        '"abc";k=',
        '"abc",  "def"',
    ],
)
def test_parse_rejects_invalid_keys(raw):
    with pytest.raises(InvalidKey):
        IdemKey.parse(raw)


def test_constructor_validates():
    with pytest.raises(InvalidKey):
        IdemKey("")
    with pytest.raises(InvalidKey):
        IdemKey(42)


def test_helpers_make_valid_keys():
    u = uuid.UUID("12345678-1234-5678-1234-567812345678")
    assert IdemKey.from_uuid(u).value == str(u)
    assert len(IdemKey.from_uuid().value) == 36
    assert IdemKey.from_fields("invoice", 42, "pay").value == "invoice:42:pay"
    hashed = IdemKey.from_hash("invoice", 42, {"b": 1, "a": "é"})
    assert len(hashed.value) == 64
    assert hashed == IdemKey.from_hash("invoice", 42, {"a": "é", "b": 1})  # canonical: key order irrelevant
    assert hashed != IdemKey.from_hash("invoice", 43, {"a": "é", "b": 1})
    with pytest.raises(InvalidKey):
        IdemKey.from_fields()
