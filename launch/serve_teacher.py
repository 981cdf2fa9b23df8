"""Serve a teacher over the vLLM-compatible logprob API that config.teacher_endpoint scores with.

  python launch/serve_teacher.py (--checkpoint=DIR | --config=configs/pair1.py) [--port=8000] [--host=127.0.0.1]
      [--model_name=teacher] [--max_top_k=64] [--dtype=float32]

With --config the teacher is the config's own (config.teacher, its dtypes and model options, its vocabulary
slice); with --checkpoint any HF directory. Then train against it:
  python launch/train.py --config=configs/pair1.py --config.teacher_endpoint=http://127.0.0.1:8000/v1
--port=0 picks a free port; the line "serving ... at http://HOST:PORT/v1" on stderr says which. SIGTERM or
Ctrl-C stops it after the requests in flight (opd_jax/serving/server.py).
"""

from absl import flags
from ml_collections import config_flags

from launch import _cli
from opd_jax.errors import InputError

_CONFIG = config_flags.DEFINE_config_file("config", None, "A run config whose teacher to serve.", lock_config=True)
_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "HF checkpoint directory of the teacher (instead of --config).")
_HOST = flags.DEFINE_string("host", "127.0.0.1", "Address to bind (127.0.0.1: this machine only).")
_PORT = flags.DEFINE_integer("port", 8000, "Port to listen on; 0 = a free one (printed).")
_MODEL_NAME = flags.DEFINE_string("model_name", "teacher", "The model name requests must use (GET /v1/models).")
_MAX_TOP_K = flags.DEFINE_integer("max_top_k", 64, "Largest prompt_logprobs a request may ask for.")
_DTYPE = flags.DEFINE_string("dtype", "float32", "--checkpoint: parameter and compute dtype (float32 | bfloat16).")
_CHUNK = flags.DEFINE_integer("logits_chunk", 512, "Tokens per vocabulary chunk when scoring (0 = all at once).")
_DECODED = flags.DEFINE_bool("decoded_tokens", False, "Fill decoded_token in every log-prob entry, as vLLM does "
                              "(slower, more bytes; the training client does not read it).")
_TOKENIZER = flags.DEFINE_string("tokenizer", None, "Dir with tokenizer files for POST /tokenize (default: the "
                                 "checkpoint's, or the config's tokenizer / student dir).")


def serve():
  from flax import nnx

  from opd_jax.models import load_pretrained, load_tokenizer
  from opd_jax.models.finite import check_finite
  from opd_jax.models.tokenizer import has_tokenizer
  from opd_jax.serving.server import Scorer, build_app, serve as run_server
  from opd_jax.spec import PairSpec, pair_vocab
  from opd_jax.train.load import load_model

  if (_CONFIG.value is None) == (_CHECKPOINT.value is None):
    raise InputError("give exactly one of --config (serve its teacher) or --checkpoint (an HF dir)")
  if _MAX_TOP_K.value < 0 or not 0 <= _PORT.value < 65536:
    raise InputError(f"--max_top_k must be >= 0 and --port in 0..65535, got {_MAX_TOP_K.value}, {_PORT.value}")
  if _CHUNK.value < 0:
    raise InputError(f"--logits_chunk must be >= 0 (tokens per vocabulary chunk; 0 = all at once), got {_CHUNK.value}")
  if _CONFIG.value is not None:
    config = _CONFIG.value
    model = load_model(PairSpec.from_config(config), "teacher", vocab=pair_vocab(config))
    source, tokenizer_dirs = config.teacher, (config.teacher, config.tokenizer or config.student)
  else:
    model = load_pretrained(_CHECKPOINT.value, _DTYPE.value)
    check_finite(nnx.state(model), _CHECKPOINT.value)
    source, tokenizer_dirs = _CHECKPOINT.value, (_CHECKPOINT.value,)
  tokenizer_dir = _TOKENIZER.value or next((d for d in tokenizer_dirs if d and has_tokenizer(d)), None)
  tokenizer = load_tokenizer(tokenizer_dir) if tokenizer_dir else None
  scorer = Scorer(model, max_top_k=_MAX_TOP_K.value, logits_chunk=_CHUNK.value)
  app = build_app(scorer, model_name=_MODEL_NAME.value, tokenizer=tokenizer, decoded_tokens=_DECODED.value)
  run_server(app, _HOST.value, _PORT.value, announce=f"{source} as {_MODEL_NAME.value!r}")


def main(argv):
  del argv
  _cli.log_devices()
  _cli.run_or_exit(serve)


if __name__ == "__main__":
  _cli.run(main)
