"""Benchmark tables from results/bench/: the sampler on real weights (launch/bench/sampler.py --out) and the
guard's comparison with an earlier revision (launch/bench/compare.py --out); and from results/device/<run>/: OPD
at real model shapes on a lent GPU (launch/bench/device_check.sh) beside the memory planner's prediction for the
same runs. Timings of one machine, shipped with the machine, versions and commit they were measured on."""

from __future__ import annotations

import glob
import os

from opd_jax.experiments.files import read_json, read_jsonl
from study.tables.markdown import md_table, mean_cell

SAMPLER = "results/bench/sampler.jsonl"
SOURCES: dict[str, str] = {}
CAPTIONS: dict[str, str] = {}  # title -> what one run measured on which machine (results.md prints it above)


def _last_run(rows: list[dict]) -> list[dict]:
  """The rows of the most recent run in the file (one run's rows share run_started)."""
  last = rows[-1]["run_started"]
  return [r for r in rows if r["run_started"] == last]


def sampler_table(rows: list[dict]) -> str:
  """One run: tokens/s per engine, vs transformers' generate and vs this sampler's float32 weights."""
  ratio = lambda x: "" if x is None else f"{x:.2f}x"
  body = [[r["engine"].replace("opd_jax ", "opd_jax, "), str(r["tokens"]), f"{r['tokens_per_s']:.0f}",
           ratio(r["vs_transformers"]), ratio(r["vs_float32"])] for r in rows]
  return md_table(["engine", "tokens per call", "tokens/s (median)", "vs transformers", "vs opd_jax float32"], body)


def run_caption(rows: list[dict]) -> str:
  r = rows[0]
  mode = "EOS on (held-out chat prompts, through each row's EOS)" if r["mode"] == "eos_on" else "EOS off"
  return (f"{r['target']} ({r['params_m']}M parameters), batch {r['batch']}, prompt {r['prompt_tokens']}, "
          f"{r['new_tokens']} new tokens, {mode}, greedy; median of {r['rounds']} interleaved rounds; "
          f"{r['machine']['cpu']}, {r['machine']['cores']} cores; jax {r['versions']['jax']}, torch "
          f"{r['versions']['torch']}; opd_jax {r['commit']}")


def roofline_table(rows: list[dict]) -> str:
  """The float32 decode step against this machine's measured matmul ceiling and read bandwidth."""
  r = next(r for r in rows if r["engine"] == "opd_jax w=none kv=native")
  return md_table(["decode step (float32)", "measured here", "reached", "fraction"],
             [["memory read, GB/s (weights + mean KV per step)", f"{r['machine_read_gbs']:.1f}",
               f"{r['decode_read_gbs']:.1f}", f"{r['decode_read_gbs'] / r['machine_read_gbs']:.0%}"],
              ["matmul, GFLOP/s (2 x params x batch per step)", f"{r['machine_matmul_gflops']:.1f}",
               f"{r['decode_gflops']:.1f}", f"{r['decode_gflops'] / r['machine_matmul_gflops']:.0%}"]])


def compare_table(comparison: dict) -> str:
  body = [[c["engine"], f"{c['this_vs_transformers']:.2f}x", f"{c['rev_vs_transformers']:.2f}x",
           f"{c['this_over_rev']:.2f}x"] for c in comparison["comparison"]]
  return md_table(["engine", "this tree vs transformers", f"{comparison['rev']} vs transformers", "this / rev"], body)


ARMS = {"bf16": "bf16 weights + bf16 KV", "fp8": "fp8 weights + fp8 KV"}  # device_check.sh's rollout arms


def device_table(run_dir: str) -> str:
  """One device_check.sh run: per rollout arm its steady-state step (the last metrics row: the steps after the
  first interval, which includes compilation), the sampler-learner k3, the device's measured peak memory
  (memory/device_peak_gib) and the planner's prediction for the same config (plan_<arm>.json, launch/plan_memory.py
  --json): its largest program total and its train-step total."""
  gib = lambda b: b / 2**30
  body = []
  for arm, label in ARMS.items():
    rows = read_jsonl(os.path.join(run_dir, f"opd_{arm}_metrics.jsonl"), "device check metrics file")
    last = [r for r in rows if "perf/step_s" in r][-1]
    plan = read_json(os.path.join(run_dir, f"plan_{arm}.json"), "memory plan file")
    measured, planned = last["memory/device_peak_gib"], gib(plan["peak_bytes_per_device"])
    body.append([label, f"{last['perf/step_s']:.2f}", f"{last['perf/tokens_per_s']:,.0f}", f"{last['mismatch/k3']:.2g}",
                 f"{measured:.2f}", f"{planned:.2f}", f"{gib(plan['program_totals']['train_step']):.2f}",
                 f"{planned / measured:.2f}x"])
  return md_table(["rollouts", "s/step (steady)", "tokens/s", "k3 sampler vs learner", "device peak GiB (measured)",
              "planned peak GiB", "planned train step GiB", "planned / measured"], body)


def device_caption(run_dir: str) -> str:
  with open(os.path.join(run_dir, "env.log")) as f:
    gpu, versions = [line.strip() for line in f.read().splitlines() if line.strip()][1:3]
  first = read_jsonl(os.path.join(run_dir, "opd_bf16_metrics.jsonl"), "device check metrics file")
  steps = [r for r in first if "perf/step_s" in r]
  return (f"{gpu.split(',')[0]}; {versions.split(' [')[0]}; random weights at Qwen3-1.7B -> Qwen3-0.6B shapes "
          f"(opd_jax/bench/scale_pair.py build_shaped_pair), configs/real/qwen3_1p7b_to_0p6b.py at batch 32, "
          f"64-token prompts, 256-token responses, micro-batch 8; steady = steps {steps[-2]['step'] + 1}-"
          f"{steps[-1]['step']} (the first {steps[-2]['step']} include compilation); one run per arm")


def precision_floor_table(floor: dict) -> str:
  """launch/bench/precision_floor.py --out: k3 per (sampler compute, learner compute) and weight recipe."""
  recipes = list(dict.fromkeys(r["weights"] for r in floor["rows"]))
  pairs = list(dict.fromkeys((r["sampler_compute"], r["learner_compute"]) for r in floor["rows"]))
  k3 = {(r["sampler_compute"], r["learner_compute"], r["weights"]): r["k3"] for r in floor["rows"]}
  body = [[s, l, *(f"{k3[(s, l, w)]:.2g}" for w in recipes)] for s, l in pairs]
  return md_table(["sampler compute", "learner compute", *(f"k3, weights {w}" for w in recipes)], body)


def engine_table(result: dict) -> str:
  """launch/bench/engine.py --out: static vs paged engine per workload (useful tokens per second, row-steps
  computed, compiles, peak KV bytes); on the long tail also the paged engine with more rows in the static batches'
  KV memory."""
  body = []
  names = {"static": "static", "paged": "paged, same rows", "paged_same_memory": "paged, same KV memory"}
  for workload in ("equal", "longtail"):
    if workload not in result:
      continue
    row = result[workload]
    for engine in (e for e in names if e in row):
      r = row[engine]
      body.append([workload, names[engine], f"{r.get('rows', row['rows'])}", f"{r['useful_tokens']}",
                   f"{r['seconds']:.1f}", f"{r['tokens_per_s']:.1f}", f"{r['row_steps']}", f"{r['compiles']}",
                   f"{r['peak_kv_bytes'] / 2 ** 20:.1f}" if "peak_kv_bytes" in r else "-",
                   f"{row[f'{engine}_vs_static']:.2f}x" if engine != "static" else "",
                   f"{r['same_tokens']:.0%}" if "same_tokens" in r else ""])
  return md_table(["workload", "engine", "rows", "useful tokens", "seconds", "useful tokens / s", "row-steps computed",
                   "compiles", "peak KV MiB", "vs static", "requests with static's tokens"], body)


def engines_training_table(rows: list[dict]) -> str:
  """configs/sweeps/engines.py: the main pair1 run on each engine, per seed (final held-out accuracy, run k3, wall
  seconds), and the seed mean of the accuracy with its 95% t-interval where there are >= 2 seeds."""
  body = []
  for point in dict.fromkeys(r["point"] for r in rows):
    mine = sorted((r for r in rows if r["point"] == point and r["status"] == "ok"), key=lambda r: r["seed"])
    accuracy = [r["final_accuracy"] for r in mine]
    mean = mean_cell(accuracy, collapse=False)
    body.append([point, ", ".join(str(r["seed"]) for r in mine), ", ".join(f"{a:.3f}" for a in accuracy), mean,
                 ", ".join(f"{r['mismatch']['mismatch/k3']:.1e}" for r in mine),
                 ", ".join(f"{r['wall_seconds']:.0f}" for r in mine)])
  return md_table(["point", "seeds", "final accuracy per seed", "seed mean [95% t-interval]", "run k3 per seed",
                   "wall s per seed"], body)


def engine_capacity_table(result: dict) -> str:
  """Sequences held at once in one KV budget, per KV dtype: the static reservation; the paged engine's mean live
  rows while requests waited (its peak and preemptions beside), what rollout.memory.concurrent_sequences predicts,
  and the ratio to bf16 next to the bytes-per-token ratio that bounds it."""
  body = [[r["kv_dtype"], f"{r['bytes_per_token']}", f"{r['static_rows']}", f"{r['paged_mean_rows']:.1f}",
           f"{r['paged_peak_rows']}", f"{r['preempted']}", f"{r['paged_rows_predicted']}",
           f"{r['paged_rows_vs_bf16']:.2f}x", f"{r['bytes_vs_bf16']:.2f}x"] for r in result["capacity"]]
  return md_table(["KV dtype", "bytes per token", "static rows", "paged rows held when full (mean)", "paged peak",
                   "preempted", "paged rows (predicted)", "paged rows vs bf16", "tokens per byte vs bf16"], body)


def malloc_table(results: list[dict]) -> str:
  """launch/bench/malloc.py files: per config, the medians under its malloc settings and under the baseline's."""
  body = []
  for r in results:
    config, base = r["median"]["config"], r["median"]["baseline"]
    body.append([r["config"], str(r["steps"]), f"{config['step_s_mean']:.2f}", f"{base['step_s_mean']:.2f}",
                 f"**{r['baseline_over_config']['step_s_mean']:.2f}x**",
                 f"{config['sys_s']:.0f} vs {base['sys_s']:.0f}",
                 f"{config['peak_rss_bytes'] / 1e9:.2f} vs {base['peak_rss_bytes'] / 1e9:.2f}",
                 "yes" if r["same_numbers"] else "no"])
  return md_table(["config", "steps", "keep freed (default): step s", "before: step s", "before / keep",
                   "system CPU s", "peak RSS GB", "same numbers"], body)


def tables(results_dir: str) -> dict[str, str]:
  out = {}
  malloc = sorted(glob.glob(os.path.join(results_dir, "bench", "malloc*.json")))
  if malloc:
    results = [read_json(path, "malloc benchmark file") for path in malloc]
    title = "glibc malloc: freed memory kept vs returned"
    out[title], SOURCES[title] = malloc_table(results), "results/bench/malloc*.json"
    CAPTIONS[title] = ("launch/bench/malloc.py --config=CONFIG --steps=N --rounds=R: the whole loop under the "
                       "config's malloc settings and the baseline's (" + results[0]["baseline"] + "), ABBA, "
                       "each run compiling from scratch; mean step time after the first "
                       f"{results[0]['warmup']} steps, medians over the runs; at "
                       + ", ".join(sorted({r["commit"] for r in results})))
  for path in sorted(glob.glob(os.path.join(results_dir, "precision_floor_*.json"))):
    floor = read_json(path, "precision floor file")
    title = f"precision floor ({floor['pair']})"
    out[title] = precision_floor_table(floor)
    SOURCES[title] = f"results/{os.path.basename(path)}"
    CAPTIONS[title] = (f"launch/bench/precision_floor.py --config=configs/{floor['pair']}.py, {floor['prompts']} "
                       "held-out prompts, identical float32 weights, k3 of the sampler's tokens as in training")
  device_dir = os.path.join(results_dir, "device")
  for name in sorted(os.listdir(device_dir)) if os.path.isdir(device_dir) else []:
    title = f"OPD on a GPU at real shapes: {name}"
    out[title] = device_table(os.path.join(device_dir, name))
    SOURCES[title], CAPTIONS[title] = f"results/device/{name}/", device_caption(os.path.join(device_dir, name))
  path = os.path.join(results_dir, "bench", "sampler.jsonl")
  if os.path.exists(path):
    rows = read_jsonl(path, "sampler benchmark file")
    for mode in ("eos_off", "eos_on"):
      for target in dict.fromkeys(r["target"] for r in rows if r["mode"] == mode):
        run = _last_run([r for r in rows if r["mode"] == mode and r["target"] == target])
        title = f"sampler speed: {target}, {mode.replace('_', ' ')}"
        out[title] = sampler_table(run)
        SOURCES[title], CAPTIONS[title] = SAMPLER, run_caption(run)
        if mode == "eos_off" and any("decode_gflops" in r for r in run):
          out[f"{title}, roofline"] = roofline_table(run)
          SOURCES[f"{title}, roofline"] = SAMPLER
  engine = os.path.join(results_dir, "bench", "engine.json")
  if os.path.exists(engine):
    result = read_json(engine, "engine benchmark file")
    command = ("launch/bench/engine.py " + " ".join(result.get("args", []))).strip()
    for title, table in (("rollout engines: static vs paged", engine_table(result)),
                         ("rollout engines: sequences in one KV budget", engine_capacity_table(result)
                          if "capacity" in result else None)):
      if table is not None:
        out[title], SOURCES[title] = table, "results/bench/engine.json"
        CAPTIONS[title] = f"{command} on {result['backend']} ({result['checkpoint_name']}); medians of timed rounds"
  engines_dir = os.path.join(results_dir, "engines")
  files = sorted(f for f in os.listdir(engines_dir) if f.startswith("engines_seed") and f.endswith(".jsonl")) if (
      os.path.isdir(engines_dir)) else []
  if files:
    title = "rollout engines: the main pair1 run on each"
    out[title] = engines_training_table([r for f in files for r in read_jsonl(os.path.join(engines_dir, f),
                                                                              "engines sweep file")])
    SOURCES[title] = "results/engines/"
    CAPTIONS[title] = ("python launch/sweep.py --config=configs/sweeps/engines.py:seed=S (700 steps, 2 CPU cores "
                       "shared with other runs; wall seconds are illustrative)")
  bench_dir = os.path.join(results_dir, "bench")
  if os.path.isdir(bench_dir):
    for name in sorted(os.listdir(bench_dir)):
      if name.startswith("compare_") and name.endswith(".json"):
        comparison = read_json(os.path.join(bench_dir, name), "benchmark comparison file")
        r = comparison["rows"]["this"][0][0]
        title = f"speed guard: {r['target']} against {comparison['rev']}"
        out[title] = compare_table(comparison)
        SOURCES[title] = f"results/bench/{name}"
        CAPTIONS[title] = (f"launch/bench/compare.py --rev={comparison['rev']} "
                           f"--bench_flags=\"{' '.join(comparison['bench_args'])}\": {len(comparison['rows']['this'])} "
                           f"runs per tree, alternating; this tree at {r['commit']}, {comparison['rev']} at "
                           f"{comparison['rev_commit']}; each engine's median ratio to transformers' generate in the "
                           "same run")
  return out
