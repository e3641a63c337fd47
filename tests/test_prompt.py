"""How a conversation becomes tokens: the CLI, the server and the chat session
send the engine the same tokens and stop strings for the same conversation."""

from __future__ import annotations

import pytest

from edgespec.chat.prompt import PromptEncoder, encode_prompt
from edgespec.chat.session import ChatSession
from edgespec.cli import generate, main
from edgespec.engine.events import GenerationParams
from edgespec.errors import TemplateError
from edgespec.server.completion import Completer
from tests.fakes import FakeEngine

SYSTEM, FIRST, SECOND = "Be brief.", "Name a fruit.", "And a vegetable?"
GGUF_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
"""A template as a GGUF carries it (Qwen's and SmolLM2's shape)."""
PARAMS = dict(mode="plain", temperature=0.0, max_tokens=4)


class Recording:
    """An engine that notes the tokens and stop strings of every generate() call."""

    def __init__(self, engine):
        self.engine = engine
        self.calls: list[tuple[list[int], tuple[str, ...]]] = []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def generate(self, tokens, params):
        self.calls.append((list(tokens), params.stop))
        return self.engine.generate(tokens, params)

    def __enter__(self):
        return self

    def __exit__(self, *exc):  # the test owns the engine: a face's `with` does not close it
        pass


def _cli(engine, template, monkeypatch, capsys):
    """The first turn as `edgespec generate --system ... PROMPT` sends it."""
    recording = Recording(engine)
    monkeypatch.setattr(generate, "engine_from_args", lambda args, progress=None: recording)
    argv = ["generate", "--system", SYSTEM, "--mode", "plain", "--temperature", "0", "--max-tokens", "4"]
    assert main([*argv, *(["--template", template] if template else []), FIRST]) == 0, capsys.readouterr().err
    return recording.calls


def _server(engine, template):
    """Two turns as a client that resends the conversation sends them."""
    recording = Recording(engine)
    completer = Completer(recording, template=template)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": FIRST}]
    reply = "".join(part.text for part in completer.chat(messages, GenerationParams(**PARAMS)))
    messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": SECOND}]
    list(completer.chat(messages, GenerationParams(**PARAMS)))
    return recording.calls, reply


def _session(engine, template):
    """Two turns in the app's (and `edgespec chat`'s) session."""
    recording = Recording(engine)
    chat = ChatSession(recording, system_prompt=SYSTEM, template=template, params=GenerationParams(**PARAMS))
    list(chat.send(FIRST))
    reply = chat.messages[-1].content
    list(chat.send(SECOND))
    return recording.calls, reply


def _same_prompts(new_engine, template, monkeypatch, capsys):
    cli = _cli(new_engine(), template, monkeypatch, capsys)
    server, server_reply = _server(new_engine(), template)
    session, session_reply = _session(new_engine(), template)
    assert server_reply == session_reply
    assert cli == server[:1] == session[:1]
    assert server == session
    return session


@pytest.mark.parametrize("template", [None, "chatml", "llama3", "plain"])
def test_the_cli_the_server_and_the_session_send_the_same_tokens_and_stops(template, monkeypatch, capsys):
    calls = _same_prompts(lambda: FakeEngine(chat_template=GGUF_TEMPLATE, reply=lambda prompt: "Apple."),
                          template, monkeypatch, capsys)
    engine = FakeEngine(chat_template=GGUF_TEMPLATE)
    text = PromptEncoder(engine, template=template).template.render(
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": FIRST}])
    starts_with_bos = template == "llama3"  # the format writes BOS itself: not added twice
    assert calls[0][0] == engine.tokenize(text, add_bos=not starts_with_bos)
    assert calls[0][1] == (() if template is None else PromptEncoder(engine, template=template).template.stop)


def test_the_second_turn_reuses_the_first_turns_tokens():
    engine = FakeEngine(chat_template=GGUF_TEMPLATE)
    encoder = PromptEncoder(engine)
    first = encoder.encode([{"role": "user", "content": FIRST}])
    reply_tokens = [7, 8]  # what the model produced, not what its text tokenizes to
    encoder.remember(first, engine.detokenize(reply_tokens), reply_tokens)
    second = encoder.encode([{"role": "user", "content": FIRST}, {"role": "assistant", "content": "\x07\x08"}])
    assert second.tokens[:len(first.tokens) + 2] == first.tokens + reply_tokens


def test_without_a_template_raw_text_still_encodes_and_a_conversation_says_why_not():
    engine = FakeEngine(chat_template=None)
    encoder = PromptEncoder(engine, model="tiny.gguf")
    assert encoder.encode_text("<s>hi").tokens == [engine.bos, engine.bos, ord("h"), ord("i")]
    with pytest.raises(TemplateError, match="tiny.gguf has no chat template"):
        encoder.encode([{"role": "user", "content": FIRST}])
    assert encode_prompt(engine, "<s>hi", raw=True) == (engine.tokenize("<s>hi", add_bos=True, special=False), ())


@pytest.mark.slow
@pytest.mark.parametrize("template", [None, "chatml"])
def test_on_smollm2_the_three_faces_send_the_same_tokens_and_stops(smollm2, template, monkeypatch, capsys):
    from edgespec.engine.runtime import Engine, ModelSettings

    with Engine.load(ModelSettings(smollm2, n_ctx=512, exact=True)) as engine:
        calls = _same_prompts(lambda: engine, template, monkeypatch, capsys)
    assert len(calls) == 2 and calls[1][0][:len(calls[0][0])] == calls[0][0]
