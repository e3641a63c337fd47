"""Hermes-style tool calls in a reply's text (edgespec/server/tool_calls.py): whole and streamed."""

from __future__ import annotations

import json

import pytest

from edgespec.server.tool_calls import Call, CallStream, split_calls

WEATHER = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TIME = '<tool_call>\n{"name": "get_time", "arguments": {"zone": "CET"}}\n</tool_call>'


def test_one_call_alone_is_a_call_and_no_text():
    assert split_calls(WEATHER) == ("", [Call("get_weather", '{"city": "Paris"}')])


def test_two_calls_with_text_before_keep_the_text_without_the_whitespace_around_the_calls():
    text, calls = split_calls(f"Let me look.\n{WEATHER}\n{TIME}\n")
    assert text == "Let me look."
    assert [c.name for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[1].arguments) == {"zone": "CET"}


def test_text_between_and_after_calls_is_kept_and_a_call_without_arguments_has_empty_ones():
    text, calls = split_calls('A <tool_call>{"name": "f"}</tool_call> B')
    assert (text, calls) == ("AB", [Call("f", "{}")])


@pytest.mark.parametrize("block", [
    "<tool_call>\n{not json}\n</tool_call>",
    '<tool_call>\n{"arguments": {}}\n</tool_call>',
    '<tool_call>\n{"name": 3}\n</tool_call>',
    '<tool_call>\n["f"]\n</tool_call>',
    '<tool_call>\n{"name": "f"',
])
def test_a_block_that_is_not_a_call_stays_text_as_it_was(block):
    whole = f"See: {block}\n"
    assert split_calls(whole) == (whole, [])


def test_text_without_calls_is_unchanged_even_where_it_starts_like_one():
    for whole in ("plain\n", "a <tool", "x < y", "<tool_call", "  "):
        assert split_calls(whole) == (whole, [])


def test_a_closed_call_at_the_end_may_lack_its_closing_tag():
    assert split_calls('<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n') == ("", [Call("f", '{"a": 1}')])


def test_arguments_written_as_a_json_string_are_passed_as_that_string():
    assert split_calls('<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>')[1] == [Call("f", '{"a": 1}')]


def whole_of(stream: CallStream, pieces) -> tuple[str, list[Call]]:
    out = [p for piece in pieces for p in stream.feed(piece)] + stream.finish()
    return "".join(p for p in out if isinstance(p, str)), [p for p in out if isinstance(p, Call)]


@pytest.mark.parametrize("whole", [
    f"Let me look.\n{WEATHER}\n{TIME}\n",
    f"{WEATHER} done <tool_call>{{bad}}</tool_call> end \n",
    "no calls, < and <tool and <tool_cal here\n  ",
    f"text {WEATHER}",
])
def test_a_stream_split_anywhere_gives_what_the_whole_text_gives(whole):
    expected = split_calls(whole)
    for cut in range(len(whole) + 1):
        assert whole_of(CallStream(), [whole[:cut], whole[cut:]]) == expected, cut
    assert whole_of(CallStream(), list(whole)) == expected


def test_a_stream_holds_back_only_what_may_become_a_call():
    stream = CallStream()
    assert stream.feed("Hello <tool") == ["Hello"]
    assert stream.feed("box>") == [" <toolbox>"]
    assert stream.feed(WEATHER[:20]) == []
    assert stream.feed(WEATHER[20:]) == [Call("get_weather", '{"city": "Paris"}')]
    assert stream.feed("\n") == [] and stream.finish() == []
    assert stream.calls == 1


NAMES = frozenset({"get_weather"})
BARE = '{"name": "get_weather", "arguments": {"city": "Paris"}}'


@pytest.mark.parametrize("whole", [BARE, f"\n{BARE}\n", f"```json\n{BARE}\n```", f"```\n{BARE}\n```\n"])
def test_a_reply_that_is_only_a_call_of_an_offered_tool_is_a_call(whole):
    """Qwen2.5-Coder answers a tool offer with the call's JSON alone, often in a json
    fence, not in <tool_call> tags (seen with the bundled 1.5B): read as llama-server's
    Hermes parser reads it, where the name is one of the tools offered."""
    assert split_calls(whole, NAMES) == ("", [Call("get_weather", '{"city": "Paris"}')])
    for cut in range(len(whole) + 1):
        assert whole_of(CallStream(NAMES), [whole[:cut], whole[cut:]]) == ("", [Call("get_weather", '{"city": "Paris"}')])


@pytest.mark.parametrize("whole", [
    BARE,  # no tools named: JSON is an answer
    '{"name": "get_time", "arguments": {}}',  # not a tool offered
    f"It is this: {BARE}",  # text around it
    f"```json\n{BARE}\n```\nThen more.",
    f"```python\nprint({BARE!r})\n```",
    '{"name": "get_weather"',  # cut short
])
def test_json_that_is_not_an_offered_call_alone_stays_text(whole):
    names = frozenset() if whole == BARE else NAMES
    assert split_calls(whole, names) == (whole, [])
    for cut in range(len(whole) + 1):
        assert whole_of(CallStream(names), [whole[:cut], whole[cut:]]) == (whole, []), cut


def test_a_stream_that_cannot_be_a_call_alone_is_not_held_back():
    stream = CallStream(NAMES)
    assert stream.feed("```py") == ["```py"]  # a fence of another language
    stream = CallStream(NAMES)
    assert stream.feed("Sure") == ["Sure"]
    stream = CallStream(NAMES)
    assert stream.feed(" {") == [] and stream.feed('"name"') == []  # may yet be a call: held
    stream = CallStream(NAMES)
    assert stream.feed("[1] First") == ["[1] First"]  # a list, but not of JSON objects
    stream = CallStream(NAMES)
    assert stream.feed("[") == [] and stream.feed(" {") == []  # may yet be a list of calls


LLAMA = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
"""Llama 3.1-3.3's JSON tool call: "parameters" where Hermes writes "arguments"."""


@pytest.mark.parametrize("whole", [LLAMA, f"\n{LLAMA}\n", f"<tool_call>\n{LLAMA}\n</tool_call>"])
def test_a_call_that_names_its_arguments_parameters_keeps_them(whole):
    """Llama 3.x answers a tool offer with {"name": ..., "parameters": {...}}: read as
    llama-server's Llama 3.x parser reads it, never as a call without arguments."""
    assert split_calls(whole, NAMES) == ("", [Call("get_weather", '{"city": "Paris"}')])
    for cut in range(len(whole) + 1):
        assert whole_of(CallStream(NAMES), [whole[:cut], whole[cut:]]) == ("", [Call("get_weather", '{"city": "Paris"}')])


TWO = ('[{"name": "get_weather", "arguments": {"city": "Paris"}}, '
       '{"name": "get_time", "arguments": {"zone": "CET"}}]')
"""Mistral's tool calls: one JSON list of them (after its [TOOL_CALLS] control token, which is not text)."""


@pytest.mark.parametrize("whole", [TWO, f" {TWO}\n", f"```json\n{TWO}\n```"])
def test_a_reply_that_is_only_a_list_of_offered_calls_is_those_calls(whole):
    names = frozenset({"get_weather", "get_time"})
    expected = ("", [Call("get_weather", '{"city": "Paris"}'), Call("get_time", '{"zone": "CET"}')])
    assert split_calls(whole, names) == expected
    for cut in range(len(whole) + 1):
        assert whole_of(CallStream(names), [whole[:cut], whole[cut:]]) == expected, cut


@pytest.mark.parametrize("whole", [
    TWO,  # get_time not offered
    "[]",  # no calls
    '[{"name": "get_weather", "arguments": {}}, 3]',  # not all calls
    "[1, 2, 3]",
])
def test_a_list_that_is_not_all_offered_calls_stays_text(whole):
    assert split_calls(whole, NAMES) == (whole, [])
    for cut in range(len(whole) + 1):
        assert whole_of(CallStream(NAMES), [whole[:cut], whole[cut:]]) == (whole, []), cut
