"""The incremental detokenizer and the stop matcher, on their own."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tallow.runtime.text import Detokenizer, StopMatcher


def test_multibyte_character_split_across_pieces_is_held_until_complete():
    d = Detokenizer()
    snowman = "☃".encode()  # three bytes
    assert d.push(b"a" + snowman[:1]) == "a"
    assert d.push(snowman[1:2]) == ""
    assert d.push(snowman[2:]) == "☃"
    assert d.flush() == ""


def test_invalid_bytes_become_replacement_characters():
    d = Detokenizer()
    assert d.push(b"\xff") + d.push(b"ok") + d.flush() == "\ufffdok"


def test_bytes_that_could_never_be_a_character_are_still_replaced_at_the_end():
    d = Detokenizer()
    assert d.push(b"\xed") + d.push(b"\xa0") + d.flush() == "\ufffd\ufffd" and d.dropped == 0


def test_a_character_cut_at_the_end_is_dropped_not_replaced():
    d = Detokenizer()
    coffee = "☕".encode()
    assert d.push(b"coffee " + coffee[:2]) == "coffee "
    assert d.flush() == "" and d.dropped == 2
    assert d.push(b"ok") == "ok"  # the decoder starts clean after a flush


@given(st.lists(st.binary(max_size=70), max_size=40))
def test_incremental_equals_whole_decode(pieces):
    d = Detokenizer()
    out = "".join(d.push(p) for p in pieces) + d.flush()
    whole = b"".join(pieces).decode("utf-8", errors="replace")
    # Python replaces a cut character at the very end by one U+FFFD; the detokenizer drops it.
    assert 0 <= d.dropped <= 3
    assert out + ("\ufffd" if d.dropped else "") == whole


def _stream(matcher: StopMatcher, chunks: list[str]) -> tuple[str, bool]:
    out = []
    for c in chunks:
        text, stopped = matcher.push(c)
        out.append(text)
        if stopped:
            return "".join(out), True
    return "".join(out) + matcher.flush(), False


def test_stop_string_split_across_chunks_never_leaks():
    text, stopped = _stream(StopMatcher(["</end>"]), ["hello <", "/e", "nd> after"])
    assert (text, stopped) == ("hello ", True)


def test_partial_match_that_fails_is_released():
    text, stopped = _stream(StopMatcher(["STOP"]), ["ST", "ay"])
    assert (text, stopped) == ("STay", False)


def test_the_stop_that_completes_first_wins():
    text, stopped = _stream(StopMatcher(["bb", "abc"]), ["xxab", "c bb"])
    assert (text, stopped) == ("xx", True)
    text, stopped = _stream(StopMatcher(["abcd", "bc"]), ["xa", "bcd"])
    assert (text, stopped) == ("xa", True)


@settings(max_examples=300)
@given(
    st.lists(st.text(alphabet="ab<>/x", max_size=6), max_size=12),
    st.lists(st.text(alphabet="ab<>/", min_size=1, max_size=4), min_size=1, max_size=3),
)
def test_stream_output_is_the_text_before_the_first_stop(chunks, stops):
    whole = "".join(chunks)
    expected, hit = whole, False
    for end in range(1, len(whole) + 1):  # the first position where some stop string completes
        done = [s for s in stops if whole[:end].endswith(s)]
        if done:
            expected, hit = whole[: end - max(map(len, done))], True
            break
    text, stopped = _stream(StopMatcher(stops), chunks)
    assert stopped == hit
    assert text == expected
    assert not any(s in text for s in stops)
