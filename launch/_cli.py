"""Shared bits of the launch scripts: quiet logs, a persistent compilation cache, device logging and the
one-line error contract.

Error contract: bad input (a flag, a config file or field, a checkpoint, data, a workdir, a results / budget /
recipe file) ends the script with exit code 2 and one line on stderr that starts with `error:`, names the culprit
and says what to do; nothing half-written is left behind. Flag and config-override errors are caught where the
flags are parsed (`run`); everything later is raised as `opd_jax.errors.InputError` by the loading and
validation functions and turned into that line by `run_or_exit`. Any other exception is a bug and keeps its
traceback. Set OPD_JAX_DEBUG=1 to see the traceback of an input error too.
"""

import os
import re
import sys

# XLA executables are cached here across runs (a repeated admission check skips most of its compilation:
# 8.3 -> 5.2 s for fp8 weights on pair1). Set OPD_JAX_COMPILATION_CACHE=off to disable, or to another folder.
CACHE_ENV = "OPD_JAX_COMPILATION_CACHE"
DEFAULT_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "opd_jax", "xla")
DEBUG_ENV = "OPD_JAX_DEBUG"
_SWITCHES = {"off": None, "0": None, "false": None, "no": None, "": None,
             "on": DEFAULT_CACHE, "1": DEFAULT_CACHE, "true": DEFAULT_CACHE, "yes": DEFAULT_CACHE}


def cache_dir(value: str | None) -> str | None:
  """The compilation cache folder an OPD_JAX_COMPILATION_CACHE value names (unset: the default), None when off;
  on / off and their usual spellings are switches, not folders named so."""
  if value is None:
    return DEFAULT_CACHE
  return _SWITCHES.get(value.strip().lower(), value)


def quiet_logs() -> None:
  """Quiet logs and the persistent compilation cache; every launch script calls this (or log_devices) first."""
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
  from absl import logging
  logging.set_verbosity(logging.WARNING)  # orbax and jax log every checkpoint step at INFO
  cache = cache_dir(os.environ.get(CACHE_ENV))
  if cache:
    import jax
    jax.config.update("jax_compilation_cache_dir", cache)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.1)


def log_devices(log_dir: str | None = None) -> None:
  """Starts the backend and prints its devices; a backend that cannot start is one `error:` line (run_or_exit)."""
  quiet_logs()
  import jax
  count, platform = run_or_exit(lambda: (jax.device_count(), jax.devices()[0].platform), log_dir)
  print(f"jax {jax.__version__}: {count} x {platform} device(s)", file=sys.stderr)


def fail(message: str, code: int = 2):
  """Prints `error: message` (one line) and exits with `code`."""
  print("error: " + " ".join(str(message).split()), file=sys.stderr)
  sys.exit(code)


def run_or_exit(fn, log_dir: str | None = None):
  """Runs fn; an InputError (bad config or input, raised by the loading / validation functions) becomes one
  `error:` line on stderr and exit code 2. A backend limit the user can act on (opd_jax.backend_errors: device
  memory or disk, a dtype the backend cannot compute, a missing cuDNN / accelerator runtime) becomes one `error:`
  line naming the setting to change and where the full trace went (log_dir/error.log, the run's workdir; a
  temporary file without one), exit 1 for out of memory or disk, 2 otherwise. Anything else keeps its traceback."""
  from opd_jax import backend_errors
  from opd_jax.errors import InputError
  try:
    return fn()
  except InputError as e:
    if os.environ.get(DEBUG_ENV):
      raise
    fail(e)
  except (RuntimeError, ValueError, MemoryError, AssertionError, OSError) as e:
    found = backend_errors.explain(e)
    if found is None or os.environ.get(DEBUG_ENV):
      raise
    message, code = found
    fail(f"{message} (full trace: {_write_trace(log_dir)})", code)


def _write_trace(log_dir: str | None) -> str:
  """The exception being handled, with its traceback, in log_dir/error.log (written whole: temp file + rename);
  in a new temporary file when log_dir is None or cannot be written."""
  import tempfile
  import traceback
  text = traceback.format_exc()
  if log_dir:
    from opd_jax.experiments.files import write_text
    try:
      os.makedirs(log_dir, exist_ok=True)
      write_text(os.path.join(log_dir, "error.log"), text)
      return os.path.join(log_dir, "error.log")
    except OSError:
      pass
  try:
    fd, path = tempfile.mkstemp(prefix="opd_jax_error_", suffix=".log")
    with os.fdopen(fd, "w") as f:
      f.write(text)
    return path
  except OSError as e:  # a full disk: the message still goes out
    return f"not written, {e.strerror or e}"


def git(root: str, *args: str) -> str:
  """`git -C root args...`'s output; a failure is an InputError naming the command (the revision-comparing
  benchmarks check their --rev with it)."""
  import subprocess
  result = subprocess.run(["git", "-C", root, *args], capture_output=True, text=True)
  if result.returncode:
    from opd_jax.errors import InputError
    raise InputError(f"git {' '.join(args)} failed: {result.stderr.strip().splitlines()[-1:]}; give --rev as a "
                     "commit, tag or branch of this repository")
  return result.stdout.strip()


def run(main, required: tuple[str, ...] = ()) -> None:
  """absl's app.run, with flag errors under the contract: an unknown flag, a value of the wrong type, a config
  file that is missing or raises, a `--config.x.y=v` override naming no field, a missing required flag or a
  stray positional argument is one `error:` line and exit code 2. Also installs the quieting of orbax's abandoned
  reads after a damaged checkpoint (opd_jax/train/checkpoint/quiet.py), which a library leaves to its host."""
  from absl import app

  from opd_jax.train.checkpoint import quiet
  quiet.install()
  app.run(main, flags_parser=lambda argv: _parse_flags(argv, required))


def _parse_flags(argv: list[str], required: tuple[str, ...]) -> list[str]:
  from absl import flags
  try:
    rest = flags.FLAGS(argv)
  except flags.Error as e:
    fail(_flag_error(str(e)))
  except (AttributeError, KeyError) as e:  # ml_collections: a --config.x.y override names no field
    if "has no attribute 'get_config'" in str(e):
      given = next((a for a in argv[1:] if a.startswith("--config=")), "--config")
      fail(f"{given}: the file defines no get_config(arg=None); a config file returns its ConfigDict from it "
           "(see configs/pair1.py)")
    fail(_override_error(argv, e))
  except SyntaxError as e:  # a config file that is not valid Python
    fail(f"config file {e.filename!r} is not valid Python ({e.msg}, line {e.lineno}); fix it or give another --config")
  for name in flags.FLAGS:  # ml_collections defers a config file it cannot read to the first use
    if type(flags.FLAGS[name].value).__name__ == "_ErrorConfig":
      given = next((a for a in argv[1:] if a.startswith(f"--{name}=")), f"--{name}")
      path = given.partition("=")[2].split(":")[0]
      fail(f"{given}: config file {path!r} does not exist or cannot be read; give a path like {_example(name)}")
    value = flags.FLAGS[name].value  # a config file flag's get_config() must return a ConfigDict
    if type(flags.FLAGS[name]).__name__ == "_ConfigFlag" and value is not None and not hasattr(value, "lock"):
      fail(f"--{name}: get_config() returned a {type(value).__name__}, not an ml_collections.ConfigDict; return "
           "one (see configs/pair1.py)")
  missing = [f"--{name}" for name in required if flags.FLAGS[name].value is None]
  if missing:
    fail(f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} required; see --helpshort")
  if len(rest) > 1:
    fail(f"unexpected argument {rest[1]!r}; flags take the form --name=value (see --helpshort)")
  return rest


def _example(name: str) -> str:
  """The config file a flag's help names ("e.g. configs/sweeps/noise.py"), else the embedded default pair's."""
  from absl import flags
  found = re.search(r"e\.g\. (\S+\.py)", flags.FLAGS[name].help or "")
  return found.group(1) if found else "configs/pair1.py"


def _flag_error(message: str) -> str:
  """absl's message, reduced to one line; a config file's own exception is kept, its traceback dropped."""
  lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
  head = lines[0].removesuffix(" Error whilst parsing config file:")
  if len(lines) == 1:
    return head
  cause = re.sub(r"^\w+(Error|Exception): ", "", lines[-1])
  return f"{head} {cause}"


def _override_error(argv: list[str], e: Exception) -> str:
  """The override that names no field, with ml_collections' suggestion."""
  text = str(e.args[0] if e.args else e)
  match = re.search(r"[A-Za-z_]\w*", text)  # the message starts with the quoted (and escaped) missing key
  field = match.group(0) if match else text
  hint = re.search(r'Did you mean "([^"]+)"', text)
  culprit = next((a for a in argv[1:] if re.search(rf"\.{re.escape(field)}(=|\.|$)", a.split("=")[0] + "=")),
                 "a --config override")
  suggestion = f' (did you mean "{hint.group(1)}"?)' if hint else ""
  return f"{culprit}: the config has no field {field!r}{suggestion}; the config file lists every field"
