"""The pre-registered held-out validation of admission (issue 34): a candidate pool, its screen with the shipped
admission path, the rule that selects from the screen, and what the selection must stay clear of.

Pool (`candidate_pool`): real rollout recipes (weights int8 / fp8 / fp8_tensor / int4 / int3 / int2, int4 and int3
with the embedding quantized too, KV int8 / fp8 / int4, weight + KV combinations, staleness alone and on top of a
recipe) and weight noise at sigmas no shipped run used (`SIGMAS`, rollout.noise_seed fixed at 0, so every seed of
the sweep trains the same noise draw the screen measured).

Screen (`screen_pair`): per pair, every pool candidate the pair never trained in a shipped results file
(`trained_before`: same mismatch knobs, noise draw aside) is measured by `candidates.screen`, the function
`launch/admit.py --candidates` runs, on the calibration batch `study/report.py --validate` measures on (128
held-out prompts, seed 0) and judged at the sweep's 150 steps; no training.

Rule (`select`, RULE below): with the shipped budget file, admission.admit_value gives each screened candidate the
k3 it compares (step-0 k3 / the pair's k3 factor) and the budget it compares it with; ratio = compared / budget.

Readout baseline (`calibration_constant`): the constant threshold on that compared k3 fitted on the calibration
points only, reported beside the shipped rule, reject-all and admit-all.

Plans (`Plan`, `PLANS`): the embedded pairs' validation above (`EMBEDDED`), and the real pair's
(`smollm2_plan()`: configs/sweeps/smollm2_budget.py's pool, rule, seeds and run length, judged against
results/smollm2/budget.json). Every function below takes the plan it works for; the default is `EMBEDDED`.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import math
import os
import time

import numpy as np

from opd_jax.errors import InputError
from opd_jax.experiments.files import file_hash, read_jsonl
from opd_jax.experiments.run_identity import code_version
from opd_jax.rollout.config import RolloutConfig
from opd_jax.screening import admission, candidates

PAIRS = ("pair1", "pair2", "pair3")
SEEDS = (3, 4, 5)  # the validation sweep's seeds; every shipped run used 0, 1 or 2
STEPS = 150  # the sweep's run length, the horizon the budgets are calibrated at
PROMPTS, SCREEN_SEED = 128, 0  # the calibration batch of study/report.py --validate (its defaults)
NEAR = 1.5  # "near": compared k3 within x/÷ NEAR of the budget
NEAR_PER_PAIR, FAR_PER_PAIR = 3, 3
# Weight-noise sigmas no shipped run used (calibration 0.1 / 0.15 / 0.2 / 0.3; pair_budgets 0.115 / 0.12 / 0.125 /
# 0.13 / 0.15 / 0.165; boundary 0.125 / 0.16 / 0.19): a grid that puts candidates on both sides of the budget on
# every pair (0.1175-0.1275 for pair2, whose k3 jumps from 0.9x to 1.9x the budget between 0.11 and 0.135).
SIGMAS = (0.07, 0.105, 0.11, 0.1175, 0.1225, 0.1275, 0.135, 0.14, 0.145, 0.155, 0.17, 0.175, 0.25)
# The rollout fields that change what the sampler samples: two runs with equal knobs ran the same configuration
# (noise_seed aside: a new draw of the same noise is not a new configuration).
KNOBS = ("weights", "weight_rules", "quantize_embedding", "kv_cache", "staleness_steps", "noise_sigma", "noise_order",
         "temperature", "top_k", "top_p", "max_new_tokens")
RULE = (f"Per pair, every screened candidate is judged by admission.admit_value with the budget file at {STEPS} "
        f"steps; ratio = the k3 it compares (step-0 k3 / the pair's factor) / the budget it compares it with. Near: "
        f"1/{NEAR:g} <= ratio <= {NEAR:g}, split at ratio 1 into near-below (admitted) and near-above (rejected); "
        f"far: below or above that band. Rank: real recipes (no weight noise) first, then |log ratio| ascending "
        f"(closest to the budget first), then name. Pick, of the near, the first near-below, the first near-above "
        f"and the next {NEAR_PER_PAIR - 2} of either; of the far, the first below the band, the first above it and "
        f"the next {FAR_PER_PAIR - 2} of either. A pair without a candidate in each of the four groups, or with "
        f"too few near, is an error.")


def candidate_pool() -> list[dict]:
  """Rollout overrides (RolloutConfig field names), in a fixed order."""
  pool = [{"weights": w} for w in ("int8", "fp8", "fp8_tensor", "int4", "int3", "int2")]
  pool += [{"weights": w, "quantize_embedding": True} for w in ("int4", "int3")]
  pool += [{"kv_cache": kv} for kv in ("int8", "fp8_e4m3", "int4")]
  pool += [{"weights": w, "kv_cache": kv} for w in ("int8", "fp8", "int4", "int3")
           for kv in ("int8", "fp8_e4m3", "int4")]
  pool += [{"staleness_steps": s} for s in (4, 16)]
  pool += [{"weights": "int4", "kv_cache": "int4", "staleness_steps": s} for s in (2, 4, 16)]
  pool += [{"weights": "int3", "staleness_steps": 4},
           {"weights": "int4", "quantize_embedding": True, "staleness_steps": 4}]
  pool += [{"noise_sigma": s, "noise_seed": 0} for s in SIGMAS]
  return pool


@dataclasses.dataclass(frozen=True)
class Plan:
  """One pre-registered held-out validation: what it screens, the rule that selects, what the runs train."""
  name: str
  pairs: tuple[str, ...]
  pool: tuple[dict, ...]  # rollout overrides (RolloutConfig field names), in a fixed order
  seeds: tuple[int, ...]  # the validation sweep's seeds
  steps: int  # the run length the budget is read at (and the sweep trains)
  near_count: int  # points picked per pair within x/÷ `near` of the budget ...
  far_count: int  # ... and outside that band
  budget: str  # the budget file admission judges with (repo-relative)
  out_dir: str  # the screens and the selection (repo-relative)
  similar: tuple[str, ...]  # results files of runs like the sweep's, for its cost estimate
  trained_in: str  # glob under results/: the runs a candidate must not repeat
  rule: str
  strict: bool = True  # a missing group is an error (else the selection is what the screen has)
  prompts: int = PROMPTS
  screen_seed: int = SCREEN_SEED
  near: float = NEAR


EMBEDDED = Plan(
    "embedded", PAIRS, tuple(candidate_pool()), SEEDS, STEPS, NEAR_PER_PAIR, FAR_PER_PAIR, "results/budget.json",
    "results/validation_heldout", tuple(f"results/pair_budgets_seed{s}.jsonl" for s in range(3)), "**/*.jsonl", RULE)


def smollm2_plan() -> Plan:
  """The real pair's validation, as configs/sweeps/smollm2_budget.py pre-registered it: its HELDOUT_POOL screened
  whole (the rule excludes only what calibration trained: none, by construction), 3 near and 2 far."""
  from configs.sweeps import smollm2_budget as campaign
  return Plan("smollm2", ("smollm2",), tuple(campaign.HELDOUT_POOL), tuple(campaign.HELDOUT_SEEDS),
              campaign.SHORT_STEPS, 3, 2, "results/smollm2/budget.json", "results/smollm2/validation",
              tuple(f"results/smollm2/campaign/smollm2_budget_seed{s}.jsonl" for s in campaign.SEEDS),
              "smollm2/campaign/smollm2_budget_seed*.jsonl", campaign.HELDOUT_RULE, strict=False)


PLANS = {"embedded": lambda: EMBEDDED, "smollm2": smollm2_plan}


def plan_for(name: str) -> Plan:
  if name not in PLANS:
    raise InputError(f"no held-out validation plan {name!r}; the plans are {sorted(PLANS)}")
  return PLANS[name]()



def point_name(overrides: dict) -> str:
  """w_int4e_kv_int8_stale_4, noise_0.135, ..."""
  parts = []
  if overrides.get("weights"):
    parts.append(f"w_{overrides['weights']}" + ("e" if overrides.get("quantize_embedding") else ""))
  if overrides.get("kv_cache"):
    parts.append(f"kv_{overrides['kv_cache']}")
  if overrides.get("staleness_steps"):
    parts.append(f"stale_{overrides['staleness_steps']}")
  if overrides.get("noise_sigma"):
    parts.append(f"noise_{overrides['noise_sigma']:g}")
  return "_".join(parts)


def is_real(overrides: dict) -> bool:
  """A real rollout recipe: precision, KV dtype and staleness only, no weight noise."""
  return not overrides.get("noise_sigma")


def sweep_overrides(overrides: dict) -> dict:
  return {f"rollout.{k}": v for k, v in sorted(overrides.items())}


def knob_key(rollout: dict) -> str:
  """The mismatch knobs of a resolved rollout dict (missing fields at RolloutConfig's defaults), as one string."""
  defaults = {f.name: f.default for f in dataclasses.fields(RolloutConfig)}
  knobs = {k: rollout.get(k, defaults[k]) for k in KNOBS}
  knobs["weight_rules"] = [list(r) for r in knobs["weight_rules"]]
  knobs["noise_sigma"] = float(knobs["noise_sigma"])
  return json.dumps(knobs, sort_keys=True)


def _rollout_of(row: dict, base_rollout: dict) -> dict:
  """A results row's resolved rollout: its recorded one, else its pair's with the row's rollout overrides."""
  if row.get("rollout"):
    return row["rollout"]
  given = {k.split(".", 1)[1]: v for k, v in row.get("overrides", {}).items() if k.startswith("rollout.")}
  return {**base_rollout, **given}


def shipped_rows(results_dir: str, skip: str | None = None, pattern: str = "**/*.jsonl") -> dict[str, list[dict]]:
  """{path: rows} of every results JSONL under `results_dir` matching `pattern` with sweep rows (pair and point),
  except under `skip` (the validation's own directory)."""
  out = {}
  for path in sorted(glob.glob(os.path.join(results_dir, pattern), recursive=True)):
    if skip and os.path.abspath(path).startswith(os.path.abspath(skip) + os.sep):
      continue
    rows = [r for r in read_jsonl(path, "results file") if "pair" in r and "point" in r]
    if rows:
      out[path] = rows
  return out


def trained_before(shipped: dict[str, list[dict]], base_rollouts: dict[str, dict]) -> dict[tuple[str, str], list]:
  """{(pair, knob_key): ["file:point@seed", ...]} of every shipped run of the pairs in `base_rollouts` (each pair's
  config.rollout as a dict)."""
  out: dict[tuple[str, str], list] = {}
  for path, rows in shipped.items():
    for row in rows:
      if row["pair"] in base_rollouts:
        key = (row["pair"], knob_key(_rollout_of(row, base_rollouts[row["pair"]])))
        out.setdefault(key, []).append(f"{path}:{row['point']}@{row.get('seed', 0)}")
  return out


def candidate_key(pair: str, overrides: dict, base_rollouts: dict[str, dict]) -> tuple[str, str]:
  return pair, knob_key({**base_rollouts[pair], **overrides})


def screen_pair(config, budget_file: dict, budget_path: str, trained: dict, base_rollouts: dict[str, dict], *,
                shape, device_bytes: int, log=print, plan: Plan = EMBEDDED) -> dict:
  """The screen of config.pair (the pair's own config: what the validation measures with): every pool candidate
  not in `trained`, through candidates.screen; the excluded ones with the runs that trained them."""
  from opd_jax.prepare.pair import prepare_pair
  from opd_jax.screening.calibration import Calibration
  from opd_jax.spec import screening_spec
  pair, start = config.pair, time.time()
  listed, excluded = [], []
  for overrides in plan.pool:
    where = trained.get(candidate_key(pair, overrides, base_rollouts))
    if where:
      excluded.append({"candidate": point_name(overrides), "overrides": overrides, "trained_in": sorted(where)})
    else:
      listed.append(candidates.Candidate(point_name(overrides), overrides))
  log(f"{pair}: screening {len(listed)} candidates ({len(excluded)} of the pool were trained before)")
  prepare_pair(config)
  spec = screening_spec(config)
  cal = Calibration.from_spec(spec, plan.prompts, plan.screen_seed)
  rows = candidates.screen(cal, spec, listed, budget_file, shape=shape, device_bytes=device_bytes,
                           seed=plan.screen_seed, steps=plan.steps)
  return {"pair": pair, "steps": plan.steps, "prompts": plan.prompts, "seed": plan.screen_seed,
          "budget_file": budget_path, "budget_sha256": file_hash(budget_path), "code_version": code_version(),
          "pool": len(plan.pool),
          "rows": rows, "excluded": excluded, "seconds": time.time() - start}


def judge_candidate(pair: str, measured: float, budget_file: dict, plan: Plan = EMBEDDED) -> dict:
  """The shipped rule's comparison of one screened value: compared k3, budget, ratio and band."""
  result = admission.admit_value(measured, budget_file, pair, plan.steps)
  ratio = result["compared"] / result["budget"]
  band = "near" if 1 / plan.near <= ratio <= plan.near else ("far below" if ratio < 1 else "far above")
  return {"measured": measured, "compared": result["compared"], "k3_factor": result["k3_factor"],
          "budget": result["budget"], "budget_source": result["budget_source"], "admit": result["admit"],
          "ratio": ratio, "band": band}


def _rank(point: dict) -> tuple:
  distance = abs(math.log(point["ratio"])) if point["ratio"] > 0 else math.inf
  return (not point["real"], distance, point["name"])


def _pick(first: list[dict], second: list[dict], count: int) -> list[dict]:
  """The first of each group, then the next `count - 2` of both by rank (an empty group gives nothing: it is not
  filled from the other)."""
  return first[:1] + second[:1] + sorted(first[1:] + second[1:], key=_rank)[:count - 2]


def select_pair(screen: dict, budget_file: dict, plan: Plan = EMBEDDED) -> list[dict]:
  """The plan's rule on one pair's screen; the points in pick order (near first)."""
  pair = screen["pair"]
  points = [{"name": r["candidate"], "overrides": sweep_overrides(r["overrides"]), "real": is_real(r["overrides"]),
             **judge_candidate(pair, r["measured"], budget_file, plan)} for r in screen["rows"]]
  group = lambda p: f"{p['band']} {'below' if p['ratio'] <= 1 else 'above'}" if p["band"] == "near" else p["band"]
  groups = {g: sorted((p for p in points if group(p) == g), key=_rank)
            for g in ("near below", "near above", "far below", "far above")}
  near = len(groups["near below"]) + len(groups["near above"])
  lacking = not all(groups.values()) or near < plan.near_count or len(points) - near < plan.far_count
  if plan.strict and lacking:
    raise InputError(f"{pair}'s screen has {', '.join(f'{len(v)} {g}' for g, v in groups.items())} candidates; "
                     f"the rule needs one in each group and {plan.near_count} near, {plan.far_count} far: widen "
                     "heldout.candidate_pool and screen again (before any run)")
  return (_pick(groups["near below"], groups["near above"], plan.near_count)
          + _pick(groups["far below"], groups["far above"], plan.far_count))


def select(screens: dict[str, dict], budget_file: dict, plan: Plan = EMBEDDED) -> dict[str, list[dict]]:
  """The plan's rule on every pair's screen: {pair: points}."""
  return {pair: select_pair(screens[pair], budget_file, plan) for pair in sorted(screens)}


def cost_estimate(similar: dict[str, list[dict]], selection: dict[str, list[dict]], plan: Plan = EMBEDDED) -> dict:
  """Sweep cost from the wall_seconds of similar shipped runs (`similar`: {path: rows}, runs of the same pairs at
  the plan's length): each pair's mean seconds per run times its runs (its points + its baseline, per seed)."""
  per_run, runs = {}, {}
  for pair, points in selection.items():
    seconds = [r["wall_seconds"] for rows in similar.values() for r in rows
               if r["pair"] == pair and r.get("status") == "ok" and r.get("steps") == plan.steps]
    if not seconds:
      raise InputError(f"no finished {plan.steps}-step run of {pair} in {sorted(similar)} to estimate its run time "
                       "from")
    per_run[pair], runs[pair] = float(np.mean(seconds)), (len(points) + 1) * len(plan.seeds)
  total = sum(per_run[p] * runs[p] for p in selection)
  return {"from": sorted(similar), "seconds_per_run": per_run, "runs": runs, "total_runs": sum(runs.values()),
          "seconds": total}


def selection_file(screens: dict[str, dict], screen_paths: dict[str, str], budget_file: dict, budget_path: str,
                   similar: dict[str, list[dict]], plan: Plan = EMBEDDED) -> dict:
  """What the sweep config reads: the rule, its inputs (file hashes), the selected points and the cost estimate."""
  stale = sorted(p for p, s in screens.items() if s["budget_sha256"] != file_hash(budget_path))
  if stale:
    raise InputError(f"screen(s) of {stale} were judged with another {budget_path} than the one given; screen again")
  points = select(screens, budget_file, plan)
  return {"rule": plan.rule, "seeds": list(plan.seeds), "steps": plan.steps, "budget_file": budget_path,
          "budget_sha256": file_hash(budget_path),
          "screens": {p: {"file": screen_paths[p], "sha256": file_hash(screen_paths[p])} for p in sorted(screens)},
          "points": points, "cost_estimate": cost_estimate(similar, points, plan)}


def calibration_constant(budget_file: dict) -> dict:
  """The constant k3 threshold fitted on calibration data only (the skeptic's baseline the readout reports beside
  the shipped rule): over the calibration configurations at the main horizon (budget.json's k3_conversion points:
  each one's admission step-0 k3; its seed-mean quality loss from the pooled budget's points), the threshold t on
  the compared k3 (admission.admit_value's: step-0 k3 / the pair's factor) that judges the most of them right
  (admit iff compared <= t; right iff the loss is within the tolerance). t is the geometric midpoint of the lowest
  best-scoring gap between neighbouring values (half the smallest / twice the largest at the ends)."""
  pooled = budget_file["budgets"]["pooled"]
  losses = {(p["pair"], p["point"]): p["quality_loss"] for p in pooled["points"]}
  main = budget_file["k3_conversion"]["main_steps"]
  points = [p for p in budget_file["k3_conversion"]["points"]
            if p["steps"] == main and (p["pair"], p["point"]) in losses]
  if not points:
    raise InputError("the budget file's k3_conversion has no calibration point with a pooled quality loss")
  judged = sorted((admission.admit_value(p["admission_k3"], budget_file, p["pair"], main)["compared"],
                   losses[(p["pair"], p["point"])] <= pooled["tolerance_abs"]) for p in points)
  values = [v for v, _ in judged]
  cuts = [values[0] / 2] + [math.sqrt(a * b) for a, b in zip(values, values[1:])] + [values[-1] * 2]
  scores = [sum((v <= t) == ok for v, ok in judged) for t in cuts]
  best = max(scores)
  return {"threshold": cuts[scores.index(best)], "agreed": best, "n": len(judged), "steps": main}
