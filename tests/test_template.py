"""Chat templates: the GGUF's own in a sandbox, built-in formats by explicit choice, clear errors."""

import json

import pytest
from tests.fakes import QWEN_TOOLS, FakeEngine

from edgespec.chat.template import BUILTIN_FORMATS, chat_template
from edgespec.errors import TemplateError

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "Bye"},
]
# Qwen2.5's template, shortened: the shape most GGUF templates have.
QWEN_LIKE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def test_gguf_template_is_used_when_no_format_is_chosen():
    t = chat_template(FakeEngine(chat_template=QWEN_LIKE))
    assert t.name == "gguf"
    assert t.render(CONVERSATION[:2]) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_chosen_format_wins_over_the_gguf_template():
    t = chat_template(FakeEngine(chat_template=QWEN_LIKE), template="plain")
    assert t.render(CONVERSATION) == "Be brief.\n\nUser: Hi\n\nAssistant: Hello!\n\nUser: Bye\n\nAssistant:"
    assert t.stop == ("\nUser:",)


def test_no_template_and_none_chosen_says_how_to_choose():
    with pytest.raises(TemplateError, match="no chat template.*--template.*chatml"):
        chat_template(FakeEngine(chat_template=None), model="tiny.gguf")


def test_unknown_format_name_is_refused_not_rendered_as_text():
    with pytest.raises(TemplateError, match="Unknown chat format 'chatm1'"):
        chat_template(FakeEngine(), template="chatm1")


@pytest.mark.parametrize("name", sorted(BUILTIN_FORMATS))
def test_builtin_formats_render_every_turn_and_a_generation_prompt(name):
    text = chat_template(FakeEngine(), template=name).render(CONVERSATION)
    for m in CONVERSATION:
        assert m["content"] in text
    assert not text.endswith("Bye")  # the generation prompt follows the last turn


@pytest.mark.parametrize("name", sorted(BUILTIN_FORMATS))
def test_builtin_formats_keep_earlier_turns_as_a_prefix(name):
    """What makes KV reuse possible: turn N's prompt + reply starts turn N+1's prompt."""
    t = chat_template(FakeEngine(), template=name)
    reply = " Hello!" if name == "plain" else "Hello!"  # after "Assistant:" a model writes the space
    conversation = [*CONVERSATION[:2], {"role": "assistant", "content": reply}, CONVERSATION[3]]
    assert t.render(conversation).startswith(t.render(conversation[:2]) + reply)


def test_bos_and_eos_texts_come_from_the_engine():
    t = chat_template(FakeEngine(bos_text="<BOS>", eos_text="<EOS>"),
                      template="{{ bos_token }}{{ messages[0].content }}{{ eos_token }}")
    assert t.render(CONVERSATION[:1]) == "<BOS>Be brief.<EOS>"


def test_raise_exception_becomes_a_template_error_naming_the_model():
    source = "{% if messages[0].role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    t = chat_template(FakeEngine(chat_template=source), model="gemma-2b.gguf")
    with pytest.raises(TemplateError, match="gemma-2b.gguf.*System role not supported"):
        t.render(CONVERSATION)


@pytest.mark.parametrize("source", [
    "{{ raise_exception('\x1b]0;owned\x07\x1b[2Jfirst line\\nsecond line' + 'x' * 100000) }}",
    "{{ raise_exception(['\x1b[2J', 'x' * 100000]) }}",
])
def test_a_templates_own_words_in_an_error_are_one_short_line_of_plain_text(source):
    """raise_exception's message comes from the model file: it reached the terminal as it
    was, line breaks, escape sequences (a window title, a cleared screen) and all."""
    t = chat_template(FakeEngine(chat_template=source), model="evil.gguf")
    with pytest.raises(TemplateError) as caught:
        t.render(CONVERSATION)
    message = str(caught.value)
    assert message.startswith("The chat template of evil.gguf refused the conversation: ")
    assert message.isprintable() and len(message) < 400, message[:400]


def test_render_failures_name_the_model_and_the_fallback():
    t = chat_template(FakeEngine(chat_template="{{ messages[0].content + 1 }}"), model="odd.gguf")
    with pytest.raises(TemplateError, match="odd.gguf failed to render.*chatml"):
        t.render(CONVERSATION)


def test_invalid_jinja_is_reported_when_the_template_is_chosen():
    with pytest.raises(TemplateError, match="odd.gguf is not valid Jinja"):
        chat_template(FakeEngine(chat_template="{% for m in messages %}"), model="odd.gguf")


@pytest.mark.parametrize("source", [
    "{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}",
    "{% if 1 %}" * 3000 + "x" + "{% endif %}" * 3000,
    "{% for a in [1] %}" * 100 + "x" + "{% endfor %}" * 100,
])
def test_a_template_too_deeply_nested_to_compile_is_a_template_error_naming_the_fallback(source):
    """Valid Jinja that Jinja's parser or Python's compiler cannot take (a RecursionError, an
    IndentationError) came out of chat_template as itself: a traceback at every face."""
    with pytest.raises(TemplateError, match="odd.gguf.*--template"):
        chat_template(FakeEngine(chat_template=source), model="odd.gguf")


def test_a_template_far_longer_than_any_chat_template_is_refused_before_it_is_compiled():
    """Compiling is not bounded as rendering is: 5 MB of tags took 26 s (2-core CPU), and
    the time grows with the size. Real templates are a few kilobytes, the largest tens."""
    source = "{{ messages[0].content }}" * 20_000
    with pytest.raises(TemplateError, match=r"odd.gguf is 500,000 characters long.*--template"):
        chat_template(FakeEngine(chat_template=source), model="odd.gguf")


def test_templates_run_in_a_sandbox():
    evil = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
    t = chat_template(FakeEngine(chat_template=evil), model="evil.gguf")
    with pytest.raises(TemplateError, match="evil.gguf"):
        t.render(CONVERSATION)


def test_sandbox_is_immutable():
    t = chat_template(FakeEngine(chat_template="{% set _ = messages.append(1) %}{{ messages | length }}"))
    with pytest.raises(TemplateError):
        t.render(CONVERSATION)


def test_transformers_helpers_are_available():
    source = "{{ strftime_now('%Y') | length }} {{ {'a': 'é'} | tojson }}"
    assert chat_template(FakeEngine(chat_template=source)).render([]) == '4 {"a": "é"}'


# -- a template is untrusted: bounded in time, loop steps and size --------------------------

def _render_in_time(source: str, messages=CONVERSATION, *, limit_s: float = 20.0):
    """Render on a thread (a runaway template must not hang the test run); the result or the exception."""
    import threading

    outcome = []

    def render():
        try:
            outcome.append(chat_template(FakeEngine(chat_template=source), model="evil.gguf").render(messages))
        except Exception as e:
            outcome.append(e)

    thread = threading.Thread(target=render, daemon=True)
    thread.start()
    thread.join(limit_s)
    assert outcome, f"rendering ran past {limit_s} s"
    return outcome[0]


@pytest.mark.parametrize("source", [
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "{% for m in messages %}{% for a in range(99999) %}{% for b in range(99999) %}{% endfor %}{% endfor %}{% endfor %}",
    "{% macro f(n) %}{% for i in range(30) %}{{ f(n + 1) if n < 40 else '' }}{% endfor %}{% endmacro %}{{ f(1) }}",
    # a recursive loop's inner levels iterate what loop() is given, not the for's own iterable
    "{% set twos = [2] * 99999 %}{% set ones = [1] * 999999 %}{% for x in [3] recursive %}"
    "{% if x == 3 %}{{ loop(twos) }}{% elif x == 2 %}{{ loop(ones) }}{% endif %}{% endfor %}",
])
def test_a_template_that_runs_too_long_is_stopped_naming_the_model(source):
    error = _render_in_time(source)
    assert isinstance(error, TemplateError), error
    assert "evil.gguf" in str(error) and "--template" in str(error)


@pytest.mark.parametrize("source", [
    "{{ 'x' * 10**8 }}",
    "{{ 'x' * 10**10 }}",
    "{{ [1] * 10**9 }}",
    "{{ 'x'.ljust(10**9) }}",
    "{{ 'x' | center(10**9) }}",
    "{{ 'x' | indent(10**9, true) }}",
    "{{ '%0999999999d' % 1 }}",
    "{{ '{:>999999999}'.format(1) }}",
    "{% set ns = namespace(s='xxxxxxxx') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "{% set ns = namespace(s='xxxxxxxx') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
    "{% set ns = namespace(s='xxxxxxxx') %}{% for i in range(40) %}{% set ns.s %}{{ ns.s }}{{ ns.s }}{% endset %}"
    "{% endfor %}",
    "{{ ('x' * 4000000).replace('', 'y' * 1000) }}",
    "{{ ('y' * 1000).join(['x'] * 4000000) }}",
    "{{ 7 ** 99999999 }}",
])
def test_a_template_that_grows_too_large_is_stopped_before_it_allocates(source):
    error = _render_in_time(source)
    assert isinstance(error, TemplateError), type(error)
    assert "evil.gguf" in str(error)


@pytest.mark.parametrize("source", [
    "{{ ''.join(['x' * 4000000] * 100) }}",
    "{{ (['x' * 4000000] * 100) | join }}",
    "{{ ('x' * 4000) | replace('x', 'y' * 100000) }}",
    "{{ ('a\n' * 4000) | indent('y' * 100000, true) }}",
    # what a range, a generator or a dict's keys holds is known only once it is consumed
    "{{ range(1000) | join('y' * 100000) }}",
    "{{ ('y' * 100000).join(range(1000) | map('string')) }}",
    "{% set d = {" + ", ".join(f"'k{i}': 0" for i in range(30)) + "} %}{{ ('y' * 5000000).join(d.keys()) }}",
    "{{ range(1000) | map('center', 100000) | join }}",
    "{{ range(1000) | map('center', 100000) | list | length }}",
])
def test_a_join_replace_or_indent_too_large_is_stopped_before_it_is_built(source):
    """Their results were sized after they were built: 1.6 GB from a template whose budget
    is 8 MB (an empty separator's join was sized at nothing), and 16 GB one step further."""
    error, peak = _render_measured(source)
    assert isinstance(error, TemplateError), type(error)
    assert peak < 64 << 20, f"{peak:,} bytes at the peak"


@pytest.mark.parametrize("source", [
    "{{ range(99999) | list | tojson(indent=3000) }}",
    "{{ ('\t' * 100).expandtabs(3000000) }}",
    "{{ ('a' * 100).translate({97: 'y' * 3000000}) }}",
    "{{ ('x ' * 100) | wordwrap(2, wrapstring='y' * 3000000) }}",
    "{{ ('%999999s' * 300) % (('a',) * 300) }}",
    "{{ ('%999999s' * 300) | format(*(['a'] * 300)) }}",
    "{{ '%0299999999d' | format(1) }}",
    "{{ ('{0:>999999}' * 300).format(1) }}",
    "{{ ('{:{}}' * 100).format(*(['a', 3000000] * 100)) }}",
    "{{ lipsum(n=100000) }}",
])
def test_a_widened_or_wrapped_text_too_large_is_stopped_before_it_is_built(source):
    """Each asks for its size in a way the checks did not read: an indent repeated on every
    line, a tab's width, a mapping or wrapping string, many widths of under a million."""
    error, peak = _render_measured(source)
    assert isinstance(error, TemplateError), type(error)
    assert peak < 64 << 20, f"{peak:,} bytes at the peak"


@pytest.mark.parametrize("use", [
    "{{ many | tojson | length }}", "{{ many | string | length }}", "{{ many | map('upper') | list | length }}",
    "{{ many }}", "{{ many ~ '' }}", "{{ '%s' % (many,) }}",
])
@pytest.mark.parametrize("made", ["['x' * 7000000] * 40", "[big, big, big, big, big, big, big, big] * 5",
                                  "[" + ", ".join(["big"] * 40) + "]"])
def test_a_list_holding_one_large_text_many_times_counts_all_of_it(made, use):
    """A list of 40 items is small, but each holds the same 7 MB text: turned into text
    it was 280 MB before its size was checked (a thousand such items: 16 GB as JSON)."""
    error, peak = _render_measured(f"{{% set big = 'x' * 7000000 %}}{{% set many = {made} %}}{use}")
    assert isinstance(error, TemplateError), type(error)
    assert peak < 128 << 20, f"{peak:,} bytes at the peak"


def _render_measured(source: str):
    """The outcome of rendering `source` (see _render_in_time) and the most memory it took."""
    import tracemalloc

    tracemalloc.start()
    try:
        return _render_in_time(source), tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_bounds_leave_real_templates_on_long_conversations_alone():
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i} " * 20} for i in range(4000)]
    text = _render_in_time(QWEN_LIKE, messages)
    assert isinstance(text, str) and text.count("<|im_start|>") == 4001


# -- where each content sits in the rendered text -------------------------------------------

def _placed(rendered):
    return [rendered.text[p.start:p.end] if p else None for p in rendered.placed]


@pytest.mark.parametrize("name", [*BUILTIN_FORMATS, "gguf"])
def test_each_content_is_placed_where_the_template_put_it(name):
    """Even a content that also spells the template's own text ("user", one letter of a marker)."""
    t = chat_template(FakeEngine(chat_template=QWEN_LIKE), template=None if name == "gguf" else name)
    conversation = [{"role": "system", "content": "s"}, {"role": "user", "content": "user"},
                    {"role": "assistant", "content": " Hello! "}, {"role": "user", "content": "<|im_end|>\n"}]
    rendered = t.render_placed(conversation)
    assert rendered.aligned and rendered.text == t.render(conversation)
    assert _placed(rendered) == [m["content"] for m in conversation]
    assert all(p.verbatim for p in rendered.placed)
    starts = [p.start for p in rendered.placed]
    assert starts == sorted(starts)


def test_a_trimmed_content_is_placed_stripped_and_a_dropped_one_not_at_all():
    t = chat_template(FakeEngine(chat_template=(
        "{% for m in messages %}{% if m.role != 'system' %}<|im_start|>{{ m.role }}\n{{ m.content | trim }}"
        "<|im_end|>\n{% endif %}{% endfor %}")))
    rendered = t.render_placed([{"role": "system", "content": "dropped"}, {"role": "user", "content": "\n hi  "}])
    assert rendered.aligned and _placed(rendered) == [None, "hi"]


def test_a_rewritten_content_is_placed_between_the_templates_texts_and_not_as_verbatim():
    t = chat_template(FakeEngine(chat_template=(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content.split('</think>')[-1] }}<|im_end|>\n"
        "{% endfor %}")))
    rendered = t.render_placed([{"role": "assistant", "content": "<think>a</think>b"},
                                {"role": "user", "content": "c"}])
    assert rendered.aligned and _placed(rendered) == ["b", "c"]
    assert [p.verbatim for p in rendered.placed] == [False, True]


def test_a_template_whose_own_text_depends_on_a_content_places_nothing():
    t = chat_template(FakeEngine(chat_template=(
        "{% for m in messages %}{% if m.content == 'Hi' %}<|im_start|>{% endif %}[{{ m.content }}]{% endfor %}")))
    rendered = t.render_placed([{"role": "user", "content": "Hi"}])
    assert rendered.text == "<|im_start|>[Hi]"
    assert not rendered.aligned and rendered.placed == (None,)


def test_contents_holding_the_stand_ins_characters_are_still_placed():
    t = chat_template(FakeEngine(chat_template=QWEN_LIKE))
    conversation = [{"role": "user", "content": "\ue000" + "0\ue001"}, {"role": "user", "content": "\ue0021\ue003"}]
    rendered = t.render_placed(conversation)
    assert rendered.aligned and _placed(rendered) == [m["content"] for m in conversation]


def test_an_empty_content_is_not_placed_and_a_template_testing_for_it_still_reads():
    """Qwen2.5's template writes an assistant turn's newline only when it has content."""
    t = chat_template(FakeEngine(chat_template=(
        "{% for m in messages %}<|im_start|>{{ m.role }}{% if m.content %}\n{{ m.content }}{% endif %}<|im_end|>\n"
        "{% endfor %}")))
    rendered = t.render_placed([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": ""},
                                {"role": "user", "content": "Again"}])
    assert rendered.aligned and _placed(rendered) == ["Hi", None, "Again"]


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city, now",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CALLED = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18 °C, sunny"},
]


def test_tools_reach_a_template_that_takes_them_as_sent():
    t = chat_template(FakeEngine(chat_template=QWEN_TOOLS))
    assert t.takes_tools
    text = t.render(CALLED[:1], tools=[WEATHER_TOOL])
    assert text.startswith("<|im_start|>system\nYou are helpful.\n\n# Tools\n\n<tools>\n"
                           + json.dumps(WEATHER_TOOL, ensure_ascii=False) + "\n</tools>")
    assert "<tools>" not in t.render(CALLED[:1])  # none offered: the template's plain prompt


def test_an_assistants_calls_and_the_tools_results_are_rendered_as_the_template_writes_them():
    t = chat_template(FakeEngine(chat_template=QWEN_TOOLS))
    text = t.render(CALLED, tools=[WEATHER_TOOL])
    assert text.endswith(
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
        "<|im_end|>\n<|im_start|>user\n<tool_response>\n18 °C, sunny\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n")
    rendered = t.render_placed(CALLED, tools=[WEATHER_TOOL])
    assert rendered.aligned and rendered.text == text
    result = rendered.placed[2]
    assert result.verbatim and text[result.start:result.end] == "18 °C, sunny"


def test_whether_a_template_takes_tools_is_read_from_its_source():
    assert not chat_template(FakeEngine(), template="chatml").takes_tools
    assert chat_template(FakeEngine(), template="{% if tools %}{% endif %}{{ messages[0].content }}").takes_tools


def test_tools_count_in_the_render_budget_like_the_messages():
    source = "{{ tools | tojson }}{{ messages[0].content }}"
    tools = [{"type": "function", "function": {"name": "f", "description": "x" * 1_000_000}}] * 10
    text = chat_template(FakeEngine(), template=source).render(CALLED[:1], tools=tools)
    assert len(text) > 10_000_000  # past RENDER_CHARS, which the tools sent themselves may take
