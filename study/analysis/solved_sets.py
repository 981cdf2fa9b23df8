"""Which held-out problems each trained student solves, and how much two runs' solved sets overlap.

Two runs can end at the same accuracy by solving different problems: the count is what `eval/accuracy` reports,
the set is what tells two runs apart. Each student (an HF export, `workdir/export`) answers the pair's held-out
problems greedily through transformers (the same grader and problems as the training loop's evaluation), and
`compare` reports per run the solved count by number of terms, and per pair of runs how many verdicts agree.
"""

from __future__ import annotations

import collections
import itertools

from opd_jax.data.grader import is_correct
from opd_jax.errors import InputError


def solved(export_dir: str, problems, max_new_tokens: int = 64) -> list[bool]:
  """Greedy verdict per problem for one exported student (transformers on CPU, one problem at a time)."""
  try:
    import torch
    import transformers
  except ImportError as e:
    raise InputError(f"solved sets need torch and transformers ({e}); pip install -e '.[test]'") from None
  torch.set_num_threads(1)
  try:
    tokenizer = transformers.AutoTokenizer.from_pretrained(export_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(export_dir).eval()
  except (OSError, ValueError) as e:
    raise InputError(f"{export_dir!r} is not an exported student (launch/export.py writes one): {e}") from None
  eos = model.generation_config.eos_token_id
  pad = eos if isinstance(eos, int) else eos[0]
  out = []
  for problem in problems:
    ids = tokenizer(problem.prompt, return_tensors="pt", add_special_tokens=False).input_ids
    with torch.no_grad():
      tokens = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos,
                              pad_token_id=pad)
    text = tokenizer.decode(tokens[0, ids.shape[1]:], skip_special_tokens=True)
    out.append(bool(is_correct(text, problem.answer, problem.grader)))
  return out


def terms(prompt: str) -> int:
  return prompt.count("+") + prompt.count("-") + 1


def compare(runs: dict[str, list[bool]], problems) -> dict:
  """Per run: solved count and solved / total by number of terms; per pair of runs: agreeing verdicts and
  problems both solved."""
  sizes = [terms(p.prompt) for p in problems]
  per_run = {}
  for name, verdicts in runs.items():
    by = collections.defaultdict(lambda: [0, 0])
    for size, ok in zip(sizes, verdicts):
      by[size][0] += ok
      by[size][1] += 1
    per_run[name] = {"solved": sum(verdicts), "by_terms": {str(k): v for k, v in sorted(by.items())},
                     "verdicts": verdicts}
  pairs = [{"a": a, "b": b, "same_verdict": sum(x == y for x, y in zip(runs[a], runs[b])),
            "both_solved": sum(x and y for x, y in zip(runs[a], runs[b]))}
           for a, b in itertools.combinations(runs, 2)]
  return {"problems": len(problems), "runs": per_run, "pairs": pairs}
