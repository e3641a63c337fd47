"""Can this draft model be paired with this target? The same checks as
llama.cpp's speculative example (common/speculative.cpp), on plain data so that
they run on loaded models and on GGUF headers alike."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from edgespec.errors import IncompatibleDraftError

MAX_VOCAB_SIZE_DIFF = 128
"""llama.cpp's SPEC_VOCAB_MAX_SIZE_DIFFERENCE."""
CHECK_TOKENS_FROM = 5
"""llama.cpp's SPEC_VOCAB_CHECK_START_TOKEN_ID: the first ids may differ (special tokens)."""


@dataclass(frozen=True)
class VocabInfo:
    """What pairing needs to know about a model's vocabulary."""

    vocab_type: str
    """Tokenizer kind, e.g. "gpt2" (BPE) or "llama" (SentencePiece)."""
    tokens: Sequence[str]
    """Token texts by id."""
    bos: int | None
    eos: int | None
    add_bos: bool

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)


def pairing_problems(target: VocabInfo, draft: VocabInfo) -> list[str]:
    """Reasons the pair cannot be used for speculation; empty when it can."""
    problems = []
    if target.vocab_type != draft.vocab_type:
        problems.append(f"draft tokenizer is {draft.vocab_type!r}, target {target.vocab_type!r}")
    if abs(target.n_tokens - draft.n_tokens) > MAX_VOCAB_SIZE_DIFF:
        problems.append(
            f"draft vocab has {draft.n_tokens} tokens, target {target.n_tokens} "
            f"(they may differ by at most {MAX_VOCAB_SIZE_DIFF})"
        )
    if target.add_bos != draft.add_bos:
        problems.append(f"draft add-BOS is {draft.add_bos}, target {target.add_bos}")
    if target.add_bos and target.bos != draft.bos:
        problems.append(f"draft BOS token is {draft.bos}, target {target.bos}")
    if target.eos != draft.eos:
        problems.append(f"draft EOS token is {draft.eos}, target {target.eos}")
    if problems:
        return problems  # token texts would only repeat the story
    for i in range(CHECK_TOKENS_FROM, min(target.n_tokens, draft.n_tokens)):
        if target.tokens[i] != draft.tokens[i]:
            problems.append(
                f"token {i} is {draft.tokens[i]!r} in the draft but {target.tokens[i]!r} in the target"
            )
            break
    return problems


def ensure_compatible(target: VocabInfo, draft: VocabInfo, *, target_name: str = "target",
                      draft_name: str = "draft") -> None:
    """Raise IncompatibleDraftError naming every difference found."""
    problems = pairing_problems(target, draft)
    if problems:
        raise IncompatibleDraftError(
            f"{draft_name} cannot draft for {target_name}: " + "; ".join(problems)
        )
