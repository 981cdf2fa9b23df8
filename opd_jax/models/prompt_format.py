"""A prompt format: how a model of its own family sees a prompt, rendered by its own tokenizer. Used by a teacher
of another tokenizer (cross_tokenizer.teacher_format, teachers.<name>.format) and by the student
(data.prompt_format, e.g. a base model that has no chat format).

  "chat"     the tokenizer's chat template: one user turn holding the prompt, then the assistant's turn opened
             (add_generation_prompt), as an instruct model expects
  "plain"    the prompt text as it is
  a template any other string with `{prompt}` in it, e.g. "Q: {prompt}\nA:" for a base model prompted
             few-shot; literal braces are written `{{` and `}}`
"plain" and templates are encoded with the tokenizer's special tokens (a BOS where the tokenizer adds one, as
Gemma's does), the chat template as it renders them.
"""

from __future__ import annotations

from opd_jax.errors import InputError


def check_format(spec: str, where: str = "cross_tokenizer.teacher_format") -> None:
  """'chat', 'plain', or a template that renders and names {prompt}; anything else is an InputError naming it."""
  if spec in ("chat", "plain"):
    return
  try:
    rendered = spec.format(prompt="")
  except (KeyError, IndexError, ValueError) as e:
    raise InputError(f"{where}={spec!r} does not render ({type(e).__name__}: {e}); a template names only "
                     "{prompt} and writes literal braces as {{ and }}") from None
  if "{prompt}" not in spec.replace("{{", "").replace("}}", "") or rendered == spec:
    raise InputError(f"{where}={spec!r} is neither 'chat', 'plain' nor a template with {{prompt}} in it")


class PromptFormat:
  """A checked prompt format (module docstring); `ids(prompt)` renders and tokenizes one prompt. where: the config
  field it came from, named in errors."""

  def __init__(self, spec: str, tokenizer, where: str = "cross_tokenizer.teacher_format"):
    self.spec, self.tokenizer = spec, tokenizer
    check_format(spec, where)
    if spec == "chat" and not getattr(tokenizer, "chat_template", None):
      raise InputError(f"{where}='chat', but that model's tokenizer has no chat template (a base model); set it "
                       "to 'plain' or a template such as 'Q: {prompt}\\nA:'")

  def text(self, prompt: str) -> str:
    """The prompt's text in this format (for "chat", as the template renders it)."""
    if self.spec == "chat":
      return self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                                tokenize=False)
    return prompt if self.spec == "plain" else self.spec.format(prompt=prompt)

  def ids(self, prompt: str) -> list[int]:
    if self.spec == "chat":  # the template writes its own special tokens
      return list(self.tokenizer.encode(self.text(prompt), add_special_tokens=False))
    return list(self.tokenizer.encode(self.text(prompt), add_special_tokens=True))
