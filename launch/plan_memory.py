"""Memory planner: does a teacher -> student OPD run fit the device? No GPU and no weights needed.

  python launch/plan_memory.py --config=configs/real/qwen3_1p7b_to_0p6b.py [--config.x.y=v ...] [--devices=N]
  python launch/plan_memory.py --teacher=qwen3-1.7b --student=qwen3-0.6b --batch=64 --prompt_tokens=256 \
      --response_tokens=1024 --device_memory_gb=80 [--devices=8 --mesh_fsdp=8 --mesh_tensor=1] \
      [--weights=none|bf16|int8|fp8] [--kv_cache=native|bf16|int8|fp8] [--staleness=k] [--micro_batch_size=M] \
      [--logits_chunk=C] [--remat=none|full|dots_saveable] [--objective=NAME] [--json] \
      [--placement=colocated|disaggregated --rollout_devices=N --rollout_tensor=T] [--quantize_embedding] \
      [--snapshots_on=device|host] [--split_mismatch]

With --config it plans exactly the run `launch/train.py --config=...` executes: every setting comes from the
run config (the loop and the planner build their programs with the same functions, opd_jax/train/programs.py),
the model shapes from config.teacher / config.student (an HF directory, or a shipped shape name); any of the
flags below given as well overrides its config field. Without --config the flags describe the run.
--teacher / --student: an HF config.json directory or a shipped real shape (opd_jax.models.shapes). Compiles
every program of the run with abstract shapes on --devices simulated CPU devices and prints per-device
argument / output / temp / alias / peak GiB per program, the resident bytes between programs, the verdict and
the largest micro-batch that fits (see opd_jax/planning/memory_plan.py). The sampler is compiled on its own
mesh (data x --rollout_tensor): over all --devices when colocated, over the first --rollout_devices of them
when disaggregated (the learner's mesh takes the rest). --json prints one JSON object
instead. --measure_rss also runs the train step on real arrays on CPU and compares the prediction with the
measured peak RSS (small configs only). --host_rss also predicts the peak resident memory of the whole run on a
CPU host (runtime + compile + device buffers + host snapshots; opd_jax/planning/host_memory.py), at the cost of
compiling the run's programs once more at its own settings. Exit code 0 (fits or not), 2 on bad input.
"""

import json
import os
import sys

from absl import flags
from ml_collections import config_flags

from launch import _cli
from opd_jax.errors import InputError

_CONFIG = config_flags.DEFINE_config_file("config", None, "Run config to plan (e.g. configs/real/...py).",
                                          lock_config=True)
_TEACHER = flags.DEFINE_string("teacher", None, "Teacher: HF config dir or shipped name (opd_jax/assets/model_shapes).")
_STUDENT = flags.DEFINE_string("student", None, "Student: HF config dir or shipped name (opd_jax/assets/model_shapes).")
_BATCH = flags.DEFINE_integer("batch", 64, "Responses per train step (B).")
_PROMPT = flags.DEFINE_integer("prompt_tokens", 256, "Prompt length (P).")
_RESPONSE = flags.DEFINE_integer("response_tokens", 1024, "Response length / max new tokens (R).")
_MEMORY = flags.DEFINE_float("device_memory_gb", 80.0, "Memory of one device in GiB (2**30 bytes).")
_DEVICES = flags.DEFINE_integer("devices", 1, "Simulated devices in the mesh (with --config: the devices its mesh "
                                "and rollout placement name, unless given).")
_FSDP = flags.DEFINE_integer("mesh_fsdp", 1, "fsdp axis size (data = devices / (fsdp * tensor)).")
_TENSOR = flags.DEFINE_integer("mesh_tensor", 1, "tensor axis size.")
_WEIGHTS = flags.DEFINE_string("weights", "none", "Sampler weight recipe: none | bf16 | int8 | fp8.")
_KV = flags.DEFINE_string("kv_cache", "native", "Sampler KV cache: native | bf16 | int8 | fp8.")
_STALENESS = flags.DEFINE_integer("staleness", 0, "Sampler weight snapshots kept (staleness steps).")
_MICRO = flags.DEFINE_integer("micro_batch_size", 0, "Train-step micro-batch; 0 = the whole batch.")
_CHUNK = flags.DEFINE_integer("logits_chunk", 512, "Tokens (rows x positions) per vocabulary chunk; 0 = unchunked.")
_REMAT = flags.DEFINE_string("remat", "full", "Student layer remat: none | full | dots_saveable.")
_OBJECTIVE = flags.DEFINE_string("objective", "reverse_kl_pg", "OPD objective (decides what the teacher hands over).")
_PLACEMENT = flags.DEFINE_string("placement", "colocated", "Sampler placement: colocated | disaggregated.")
_ROLLOUT_DEVICES = flags.DEFINE_integer("rollout_devices", 0, "Disaggregated: the sampler's devices (of --devices).")
_ROLLOUT_TENSOR = flags.DEFINE_integer("rollout_tensor", 1, "Sampler mesh tensor axis.")
_EMBED = flags.DEFINE_bool("quantize_embedding", False, "int8/fp8 recipes: the embedding table too.")
_SNAPSHOTS = flags.DEFINE_string("snapshots_on", "device", "Staleness snapshots: device | host.")
_SPLIT = flags.DEFINE_bool("split_mismatch", False, "Count a dense learner copy per kept version (mismatch split).")
_JSON = flags.DEFINE_bool("json", False, "Print one JSON object instead of the table.")
_MEASURE = flags.DEFINE_bool("measure_rss", False, "Also measure the train step's peak RSS on CPU (small configs).")
_HOST = flags.DEFINE_bool("host_rss", False, "Also predict the run's peak host RSS on CPU: compiles every program "
                          "at the run's settings in a child process (opd_jax/planning/host_memory.py).")


# flag -> PlanConfig field, for flags that override a --config run's setting when given
_OVERRIDES = {"batch": "batch_size", "prompt_tokens": "prompt_tokens", "response_tokens": "response_tokens",
              "mesh_fsdp": "mesh_fsdp", "mesh_tensor": "mesh_tensor", "weights": "weights", "kv_cache": "kv_cache",
              "staleness": "staleness_steps", "micro_batch_size": "micro_batch_size", "logits_chunk": "logits_chunk",
              "remat": "remat", "objective": "objective", "placement": "placement",
              "rollout_devices": "rollout_devices", "rollout_tensor": "rollout_tensor",
              "quantize_embedding": "quantize_embedding", "snapshots_on": "snapshots_on",
              "split_mismatch": "split_mismatch"}


def _devices() -> int:
  if _CONFIG.value is not None and not flags.FLAGS["devices"].present:
    from opd_jax.planning.memory_plan import devices_of_config  # jax reads XLA_FLAGS at backend start, not at import
    return devices_of_config(_CONFIG.value)
  return _DEVICES.value


def plan_of_config(mp):
  """PlanConfig of the --config run, shapes from the config's model paths (or --teacher / --student)."""
  import dataclasses
  config = _CONFIG.value
  shapes = {role: mp.resolve_model(flag.value or config[role], f"--{role}" if flag.value else f"config.{role}")
            for role, flag in (("teacher", _TEACHER), ("student", _STUDENT))}
  plan = mp.PlanConfig.from_config(config, shapes["teacher"], shapes["student"], devices=_devices(),
                                   device_memory_bytes=int(_MEMORY.value * mp.GIB))
  given = {field: flags.FLAGS[name].value for name, field in _OVERRIDES.items() if flags.FLAGS[name].present}
  return dataclasses.replace(plan, **given) if given else plan


def _tokenizer_dirs() -> list[str]:
  """The tokenizers the run loads (the pair check reads both models' and config.tokenizer), where they exist."""
  config = _CONFIG.value
  dirs = [] if config is None else [config.teacher, config.student, config.tokenizer]
  dirs += [_TEACHER.value, _STUDENT.value]
  return list(dict.fromkeys(d for d in dirs if d and os.path.isfile(os.path.join(d, "tokenizer_config.json"))))


def run() -> None:
  from opd_jax.planning import memory_plan as mp
  from opd_jax.planning import plan_report, step_rss
  # Flags first, files after: the counts given on the command line are checked before any model is read.
  given = {name: flags.FLAGS[name].value for name in _OVERRIDES if flags.FLAGS[name].present}
  mp.check_numbers(device_memory_bytes=_MEMORY.value * mp.GIB, devices=_devices(),
                   **{_OVERRIDES[name]: value for name, value in given.items() if _OVERRIDES[name] in mp.NUMBER_FLAGS})
  if _CONFIG.value is not None:
    plan = plan_of_config(mp)
  else:
    if not _TEACHER.value or not _STUDENT.value:
      raise InputError("give --config=RUN_CONFIG, or --teacher and --student (an HF config dir or one of: "
                       f"{', '.join(mp.known_models())})")
    plan = mp.PlanConfig(
        teacher=mp.resolve_model(_TEACHER.value, "--teacher"), student=mp.resolve_model(_STUDENT.value, "--student"),
        batch_size=_BATCH.value, prompt_tokens=_PROMPT.value, response_tokens=_RESPONSE.value,
        device_memory_bytes=int(_MEMORY.value * mp.GIB), devices=_DEVICES.value, mesh_fsdp=_FSDP.value,
        mesh_tensor=_TENSOR.value, weights=_WEIGHTS.value, kv_cache=_KV.value, staleness_steps=_STALENESS.value,
        micro_batch_size=_MICRO.value, logits_chunk=_CHUNK.value, remat=_REMAT.value, objective=_OBJECTIVE.value,
        placement=_PLACEMENT.value, rollout_devices=_ROLLOUT_DEVICES.value, rollout_tensor=_ROLLOUT_TENSOR.value,
        quantize_embedding=_EMBED.value, snapshots_on=_SNAPSHOTS.value, split_mismatch=_SPLIT.value)
  log = (lambda s: None) if _JSON.value else (lambda s: print(s, file=sys.stderr, flush=True))
  result = mp.plan_memory(plan, log=log)
  out = result.to_json()
  if _MEASURE.value:
    out["rss_check"] = step_rss.measure_train_step_rss(plan)
  if _HOST.value:
    from opd_jax.planning import host_memory
    log("  predicting host RSS: the run's imports and tokenizers, every program compiled at the run's settings")
    out["host_rss"] = host_memory.predict(result, _tokenizer_dirs()).to_json()
  if _JSON.value:
    print(json.dumps(out))
    return
  print(f"teacher {plan.teacher.model_type} ({plan.teacher.num_params() / 1e6:,.1f}M params) -> student "
        f"{plan.student.model_type} ({plan.student.num_params() / 1e6:,.1f}M params)")
  print(plan_report.format_plan(result))
  if _HOST.value:
    host = out["host_rss"]
    print(f"host RSS on CPU: {host['peak_bytes'] / 1e9:.2f} GB = runtime {host['runtime_bytes'] / 1e9:.2f} + compile "
          f"{host['compile_bytes'] / 1e9:.2f} + device buffers {host['device_bytes'] / 1e9:.2f} + host snapshots "
          f"{host['snapshot_bytes'] / 1e9:.2f}")
  if _MEASURE.value:
    check = out["rss_check"]
    print(f"rss check: predicted {check['predicted_bytes'] / 2**20:.1f} MiB, measured "
          f"{check['measured_bytes'] / 2**20:.1f} MiB, relative error {check['relative_error']:+.1%}"
          + ("" if check["valid"] else " (INVALID: compilation set the peak RSS)"))


def main(argv):
  del argv
  # Simulated devices must be configured before jax is imported (quiet_logs imports it).
  flag = f"--xla_force_host_platform_device_count={_devices()}"
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  _cli.quiet_logs()
  _cli.run_or_exit(run)


if __name__ == "__main__":
  _cli.run(main)
