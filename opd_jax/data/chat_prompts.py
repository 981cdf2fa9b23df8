"""The embedded chat prompt set: instruction prompts made from templates, and a capitals task with answers.

Made by this project (no download): `opd_jax/assets/chat/sources.json` lists subjects (topics, concepts,
activities, pairs to compare, sentences to edit, things to name) and a country -> capital table; every
template below is applied to every subject of its kind. OPD needs no answers, so chat rows carry only a
"prompt" and their "source" ("chat"; capital questions: "capitals"), which `data.mix` weights. Capital
questions carry an "answer" and `"grader": "contains"` (the capital named on the response's
first line) only for the countries in sources.json's "teacher_known_capitals": those whose capital the
teacher names correctly in greedy decoding (study/build_chat_prompts.py measures it), so accuracy is
reported on a task where the teacher is reliable; the other countries' questions are plain prompts.

Split: a subject (or country) goes to the held-out set by a hash of its text (`HELDOUT_SHARE` of subjects,
`CAPITALS_HELDOUT_SHARE` of countries), and every prompt made from it goes with it, so held-out prompts ask
about things the student never trained on. The held-out file alternates capitals and chat prompts until the
capitals run out (graded capitals first), so any prefix (`train.eval_size` rows) holds both kinds evenly.

  python -m opd_jax.data.chat_prompts   # rewrites opd_jax/assets/chat/{train,heldout}.jsonl (deterministic)
"""

from __future__ import annotations

import hashlib
import json
import os
import random

from opd_jax.files import write_text

ASSET_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "assets", "chat")
HELDOUT_SHARE = 0.15  # share of chat subjects whose prompts are held out
CAPITALS_HELDOUT_SHARE = 0.5  # share of countries whose capital questions are held out
SHUFFLE_SEED = 0

TEMPLATES = {
    "topics": ["Write a haiku about {0}.", "Write a short poem about {0}.", "Describe {0} in three sentences.",
               "Write a two-sentence story about {0}.", "Give me a fun fact about {0}.",
               "List three words that describe {0}.", "Write the opening line of a story about {0}.",
               "What colors do you think of when you imagine {0}?"],
    "concepts": ["Explain {0} in simple terms.", "Explain {0} to a ten-year-old.", "Tell me about {0}.",
                 "Give an everyday example of {0}.", "Why is it useful to understand {0}?"],
    "activities": ["Give three tips for {0}.", "How do I get started with {0}?", "What are the benefits of {0}?",
                   "What are common mistakes when {0}?", "Make a one-week plan for {0}."],
    "pairs": ["What is the difference between {0} and {1}?", "Compare {0} and {1} in a few sentences.",
              "Which would you choose, {0} or {1}, and why?"],
    "sentences": ["Rewrite this sentence so it sounds more formal: \"{0}.\"",
                  "Fix the capitalization and punctuation: \"{0}\"", "Summarize this in five words: \"{0}.\""],
    "things": ["Suggest five names for a {0}.", "Write a short slogan for a {0}."],
}
CAPITAL_TEMPLATES = {"train": ["What is the capital of {0}?", "Which city is the capital of {0}?"],
                     "heldout": ["What is the capital of {0}?"]}


def _heldout(subject: str, share: float) -> bool:
  digest = hashlib.sha256(subject.encode("utf-8")).digest()
  return int.from_bytes(digest[:8], "big") / 2 ** 64 < share


def _sources(path: str | None = None) -> dict:
  with open(path or os.path.join(ASSET_DIR, "sources.json"), encoding="utf-8") as f:
    return json.load(f)


def build(sources: dict | None = None) -> dict[str, list[dict]]:
  """{"train": rows, "heldout": rows}; rows are {"prompt", "source"} or {"prompt", "answer", "grader", "source"}."""
  sources = sources or _sources()
  chat = {"train": [], "heldout": []}
  for kind, templates in TEMPLATES.items():
    for subject in sources[kind]:
      parts = subject if isinstance(subject, list) else [subject]
      split = "heldout" if _heldout(" / ".join(parts), HELDOUT_SHARE) else "train"
      chat[split] += [{"prompt": template.format(*parts), "source": "chat"} for template in templates]
  capitals = {"train": [], "heldout": []}
  known = set(sources.get("teacher_known_capitals", ()))
  for country, capital in sources["capitals"]:
    split = "heldout" if _heldout(country, CAPITALS_HELDOUT_SHARE) else "train"
    answer = {"answer": capital, "grader": "contains"} if country in known else {}
    capitals[split] += [{"prompt": t.format(country), **answer, "source": "capitals"}
                        for t in CAPITAL_TEMPLATES[split]]
  rng = random.Random(SHUFFLE_SEED)
  train = chat["train"] + capitals["train"]
  rng.shuffle(train)
  heldout_chat, heldout_capitals = chat["heldout"], capitals["heldout"]
  rng.shuffle(heldout_chat)
  rng.shuffle(heldout_capitals)
  heldout_capitals.sort(key=lambda row: "answer" not in row)  # graded first (a stable sort keeps the shuffle)
  heldout = []
  for i, row in enumerate(heldout_chat):  # alternate while both last, then the rest of the chat prompts
    if i < len(heldout_capitals):
      heldout.append(heldout_capitals[i])
    heldout.append(row)
  heldout += heldout_capitals[len(heldout_chat):]
  return {"train": train, "heldout": heldout}


def capital_questions(sources: dict | None = None) -> list[tuple[str, str, str]]:
  """(country, capital, the held-out phrasing of the question) for every country of the table."""
  sources = sources or _sources()
  return [(country, capital, CAPITAL_TEMPLATES["heldout"][0].format(country))
          for country, capital in sources["capitals"]]


def write(out_dir: str = ASSET_DIR) -> dict[str, int]:
  """Writes train.jsonl and heldout.jsonl into out_dir; returns row counts."""
  counts = {}
  for split, rows in build().items():
    path = os.path.join(out_dir, f"{split}.jsonl")
    write_text(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    counts[split] = len(rows)
  return counts


if __name__ == "__main__":
  print(write())
