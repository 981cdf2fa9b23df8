"""The embedded pairs and their main OPD runs, as tables: the pairs from the build record shipped with each pair
(opd_jax/assets/pairN/build_info.json, written by study/build_pairs.py) and the runs from
results/pairN_main/metrics.jsonl (`python launch/train.py --config=configs/pairN.py`, 700 steps)."""

from __future__ import annotations

import os

from opd_jax.experiments.files import read_json, read_jsonl
from opd_jax.train.pairs import ASSETS
from study.tables.markdown import md_table

PAIRS = ("pair1", "pair2", "pair3")
FAMILIES = {"qwen3": "Qwen3 (QK-norm)", "llama": "Llama 3 (llama3 RoPE scaling)", "qwen2": "Qwen2 (q/k/v bias)"}
SOURCES = {"embedded pairs": "opd_jax/assets/pairN/build_info.json",
           "admission screen (pair1)": "results/admission_pair1_screen.json",
           "OPD main runs (700 steps)": "results/pairN_main/metrics.jsonl, opd_jax/assets/pairN/build_info.json"}


def _params(n: int) -> str:
  return f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n / 1e3:.0f}K"


def build_info(pair: str, assets: str = ASSETS) -> dict:
  return read_json(os.path.join(assets, pair, "build_info.json"), "pair build record")


def pairs_table(assets: str = ASSETS) -> str:
  """Per pair: family, sizes and greedy accuracy of teacher and student on the build's held-out problems."""
  body = []
  for pair in PAIRS:
    info = build_info(pair, assets)
    config = read_json(os.path.join(assets, pair, "teacher", "config.json"), "teacher config")
    tied = ", tied" if config.get("tie_word_embeddings") else ", untied"
    t, s = info["teacher"], info["student"]
    body.append([pair, FAMILIES.get(config["model_type"], config["model_type"]) + tied, _params(t["params"]),
                 f"{t['heldout_greedy_accuracy']:.1%}", _params(s["params"]), f"{s['heldout_greedy_accuracy']:.1%}",
                 f"{t['params'] / s['params']:.1f}x", str(t["heldout_problems"])])
  return md_table(["pair", "family", "teacher params", "teacher acc", "student params", "student acc", "ratio",
              "held-out problems"], body)


def main_runs_table(results_dir: str, assets: str = ASSETS) -> str | None:
  """Per pair with a shipped main run: the student's held-out accuracy before and after, the share of the gap to
  the teacher it closes, the reverse KL to the teacher, and the training time on the machine that ran it."""
  body = []
  for pair in PAIRS:
    evals = [r for r in read_jsonl(os.path.join(results_dir, f"{pair}_main", "metrics.jsonl"), "metrics file")
             if "eval/accuracy" in r]
    if len(evals) < 2:
      continue
    first, last = evals[0], evals[-1]
    teacher = build_info(pair, assets)["teacher"]["heldout_greedy_accuracy"]
    gap = (last["eval/accuracy"] - first["eval/accuracy"]) / (teacher - first["eval/accuracy"])
    train_s = f"{last['time/train_s'] / 60:.1f} min" if "time/train_s" in last else "-"
    body.append([pair, str(last["step"]), f"{teacher:.1%}", f"{first['eval/accuracy']:.1%}",
                 f"**{last['eval/accuracy']:.1%}**", f"{gap:.0%}",
                 f"{last['eval/accuracy']:.1%} / {last['eval/accuracy_sampled']:.1%}",
                 f"{first['eval/reverse_kl']:.3f} -> {last['eval/reverse_kl']:.3f}", train_s])
  if not body:
    return None
  return md_table(["pair", "steps", "teacher", "student before", "student after", "gap closed",
              "greedy / sampled acc after", "reverse KL to teacher (before -> after)", "training time"], body)


def screen_table(screen: dict) -> str:
  """`launch/admit.py --candidates=... --json` output: the candidates in its ranking (admitted ones by the KV-cache
  tokens their recipe leaves at the real shape, then rejected ones by k3)."""
  gib = 2 ** 30
  body = [[str(r["rank"]), r["candidate"], f"{r['measured']:.3g}", "ADMIT" if r["admit"] else "REJECT",
           f"{r['held_weight_bytes'] / gib:.2f}", f"{r['kv_tokens']:,}", f"{r['kv_tokens_vs_bf16']:.2f}x"]
          for r in sorted(screen["rows"], key=lambda r: r["rank"])]
  return md_table(["#", "candidate", "k3", "verdict", "weights GiB", "KV tokens @ Qwen3-8B", "vs bf16"], body)


def tables(results_dir: str) -> dict[str, str]:
  out = {"embedded pairs": pairs_table()}
  main = main_runs_table(results_dir)
  if main:
    out["OPD main runs (700 steps)"] = main
  path = os.path.join(results_dir, "admission_pair1_screen.json")
  if os.path.exists(path):
    out["admission screen (pair1)"] = screen_table(read_json(path, "admission screen file"))
  return out
