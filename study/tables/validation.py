"""The admission check's validations as tables: each held-out configuration's verdict against its real runs, the
shipped rule next to simple rules (study.analysis.validation.compare_with_rules), and the two k3 quantities side by
side. Used by the results page for validation.json and by the study tables for the fresh-seed and held-out
validations."""

from __future__ import annotations

import math

from study.analysis.validation import admission_vs_run_k3, compare_with_rules
from study.tables.markdown import g3, md_table


def validation_table(validation: dict) -> str:
  """Each held-out configuration judged as launch/admit.py judges it (the validation's budget file; the budget it
  picked), against the real runs."""
  converted = any(r.get("k3_factor", 1.0) != 1.0 for r in validation["rows"])
  body = []
  for r in validation["rows"]:
    seeds = r.get("seeds", [])
    body.append([r["pair"], r["point"], g3(r["measured"]), *([f"{r['k3_factor']:.3g}"] if converted else []),
                 f"{r.get('budget_source', '')} {g3(r['budget'])}".strip(),
                 f"{r.get('measured_over_budget', math.nan):.2f}x",
                 "ADMIT" if r["admit"] else "REJECT", f"{100 * r['quality_loss']:+.1f}",
                 ", ".join(f"{100 * s['quality_loss']:+.1f}" for s in seeds),
                 "ok" if r["real_ok"] else "lost", "yes" if r["agree"] else "**no**"])
  return md_table(["pair", "held-out point", "admission k3", *(["÷ factor"] if converted else []), "budget",
                  "vs budget",
              "verdict",
              "quality loss (seed mean)", "per seed", "real run", "agree"], body)


def validation_rules_table(validation: dict) -> str:
  """The shipped admission rule's agreement next to reject-all, admit-all, the per-pair counterfactual, the
  hindsight oracle and the constant fitted on calibration points (study.analysis.validation.compare_with_rules), seed
  by seed, and on the near configurations alone, each with its interval's kind."""
  compared = compare_with_rules(validation)
  body = []
  near = [(f"{rule}, near configurations only", e) for rule, e in compared["near"].items() if e["n"]]
  for rule, e in (list(compared["rules"].items()) + [("shipped rule, seed by seed", compared["seed_level"])]
                  + near):
    note = ("any threshold in " + " or ".join(f"[{g3(lo)}, {g3(hi)})" for lo, hi in e["thresholds"])
            if "thresholds" in e else f"k3 <= {g3(e['threshold'])}" if "threshold" in e else "")
    body.append([rule, f"{e['agreed']} / {e['n']}", f"{100 * e['interval'][0]:.0f}-{100 * e['interval'][1]:.0f}%",
                 e["interval_kind"].replace("95% ", ""), note])
  return md_table(["rule", "agrees with the real runs", "95% interval", "interval", "note"], body)


def k3_quantities_table(validation: dict) -> str:
  """Admission-time k3 against the run-mean k3 the budgets are calibrated on (study.analysis.validation
  .admission_vs_run_k3), per held-out configuration, with the geometric mean ratio; with a conversion, the
  factor each row was divided by (fitted on calibration points only) and the out-of-sample residual."""
  compared = admission_vs_run_k3(validation)
  converted = compared["converted"]
  body = [[r["pair"], r["point"], g3(r["admission_k3"]), g3(r["run_k3"]), f"{r['ratio']:.2f}",
           *([f"{r['factor']:.2f}", f"{r['residual']:.2f}"] if converted else [])] for r in compared["rows"]]
  body.append(["all", f"geometric mean of {compared['n']}", "", "",
               f"{compared['geo_mean']:.2f} x/÷ {compared['geo_sd']:.2f}",
               *(["", f"{compared['residual_geo_mean']:.2f} x/÷ {compared['residual_geo_sd']:.2f}"] if converted
                 else [])])
  if converted:
    body.append(["all", "verdicts the conversion changed (against comparing the step-0 k3 unconverted)", "", "",
                 "", "", f"{compared['flips']} of {compared['n']}"])
  return md_table(["pair", "held-out point", "admission k3 (step 0)", "run-mean k3 (seed mean)", "admission / run",
              *(["factor (calibration)", "admission / factor / run"] if converted else [])], body)
