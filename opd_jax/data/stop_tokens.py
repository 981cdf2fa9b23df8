"""The student tokens that end a response besides its EOS: every token whose text contains `rollout.stop_text`."""

from __future__ import annotations

from opd_jax.data.token_texts import token_texts
from opd_jax.errors import InputError


def stop_token_ids(tokenizer, stop_text: str) -> tuple[int, ...]:
  """Ids of the (non-special) tokens whose decoded text contains `stop_text`; () for "". vLLM stops on a string
  in the decoded text; here a response ends at the token that writes it (its text before the string stays in that
  token, and is not part of the answer)."""
  if not stop_text:
    return ()
  special = set(getattr(tokenizer, "all_special_ids", []) or [])
  out = tuple(i for i, text in enumerate(token_texts(tokenizer))
              if text is not None and i not in special and stop_text in text)
  if not out:
    raise InputError(f"rollout.stop_text={stop_text!r}: no token of the student's vocabulary writes it, so no "
                     "response could stop on it; set a text the student can write, or \"\" for none")
  return out
