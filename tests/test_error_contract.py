"""The error contract of every launch script and study script, table-driven: each bad input exits 2 with exactly one `error:` line
naming the culprit, no traceback, and leaves nothing behind in its folder.

The selected cases run once (a module fixture), two at a time, each a process of its own; each case is then its own
test. Most fail while the flags are parsed (a fraction of a second); the rest load a tiny checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (id, script, arguments, fragment the error line must contain). In arguments, {d} is the case's own folder
# (created empty, plus the inputs its setup writes), {student} / {teacher} the tiny pair; {bad} is a damaged copy
# of the student made by the case's setup.
TRAIN = ("launch/train.py", "--config=configs/pair1.py:runlocal", "--workdir={d}/run")
TINY = ("--config.teacher={teacher}", "--config.student={student}")
SAMPLE = ("launch/sample.py", "--prompt_ids=3,4", "--max_new_tokens=4", "--json")
CASES = [
    # train.py: flags and config files
    ("train_unknown_field", *TRAIN, "--config.train.stepz=5", "--config.train.stepz=5: the config has no field"),
    ("train_missing_config", "launch/train.py", "--config=configs/nope.py", "--workdir={d}/run",
     "'configs/nope.py' does not exist"),
    ("train_bad_int", *TRAIN, "--config.train.steps=abc", "--config.train.steps=abc"),
    ("train_engine_unknown", *TRAIN, "--config.rollout.engine=vllm", "rollout.engine='vllm' does not exist"),
    ("train_engine_pages", *TRAIN, "--config.rollout.engine=paged", "--config.rollout.page_size=0",
     "rollout.page_size must be an integer >= 1"),
    ("train_inflight_static", *TRAIN, "--config.rollout.inflight_updates=True", "needs rollout.engine='paged'"),
    ("train_stop_text_unwritable", *TRAIN, "--config.rollout.stop_text=zz", "rollout.stop_text='zz': no token"),
    ("train_inflight_recipe", *TRAIN, "--config.rollout.engine=paged", "--config.rollout.inflight_updates=True",
     "--config.train.mode=async", "--config.rollout.weights=fp8", "needs rollout.split_mismatch=False"),
    ("train_bad_config_arg", "launch/train.py", "--config=configs/pair1.py:bogus", "--workdir={d}/run",
     "config argument 'bogus' is unknown"),
    ("train_bad_switch", "launch/train.py", "--config=configs/pair1.py:runlocal=maybe", "--workdir={d}/run",
     "'runlocal' is a switch"),
    ("train_unknown_flag", *TRAIN, "--stepz=3", "Unknown command line flag 'stepz'"),
    ("train_no_config", "launch/train.py", "--workdir={d}/run", "--config is required"),
    ("train_positional", *TRAIN, "extra", "unexpected argument 'extra'"),
    # train.py: config fields
    ("train_objective", *TRAIN, "--config.objective.name=kl", "objective.name 'kl' is unknown"),
    ("train_prompt_tokens", *TRAIN, "--config.data.max_prompt_tokens=0", "data.max_prompt_tokens"),
    ("train_weights", *TRAIN, "--config.rollout.weights=int1", "int1"),
    ("train_jsonl_missing", *TRAIN, "--config.data.source=jsonl", "data.train_file"),
    ("train_placement", *TRAIN, "--config.rollout.placement=remote", "rollout.placement"),
    ("train_malloc_arenas", *TRAIN, "--config.train.malloc_arena_max=-2", "train.malloc_arena_max must be"),
    ("train_malloc_keep_freed", *TRAIN, "--config.train.malloc_arena_max=2", "malloc_keep_freed=True needs"),
    ("train_malloc_trim", *TRAIN, "--config.train.malloc_trim=2", "flag --config.train.malloc_trim=2"),
    ("train_mix_spec", *TRAIN, "--config.data.mix=chat", "data.mix: 'chat' is not 'source=weight'"),
    ("train_mix_no_source", *TRAIN, "--config.data.mix=chat=1", "training prompts have no \"source\""),
    ("train_prompt_format", *TRAIN, "--config.data.prompt_format=Q: {{question}}", "data.prompt_format='Q: {question}'"
     " does not render"),
    # train.py: files
    ("train_workdir_file", "launch/train.py", "--config=configs/pair1.py:runlocal", "--workdir={d}/file",
     "is a file"),
    ("train_config_list", *TRAIN, "--config.teacher={teacher}", "--config.student={bad}", "holds a JSON list"),
    ("train_truncated_weights", *TRAIN, "--config.teacher={teacher}", "--config.student={bad}", "model.safetensors"),
    ("train_nan_weights", *TRAIN, "--config.teacher={teacher}", "--config.student={bad}", "non-finite"),
    ("train_jsonl_not_utf8", *TRAIN, *TINY, "--config.data.source=jsonl", "--config.data.train_file={d}/bad.jsonl",
     "--config.data.heldout_file={d}/bad.jsonl", "not UTF-8"),
    ("train_jsonl_garbage", *TRAIN, *TINY, "--config.data.source=jsonl", "--config.data.train_file={d}/garbage_problems.jsonl",
     "--config.data.heldout_file={d}/garbage_problems.jsonl", "garbage_problems.jsonl:2: not valid JSON"),
    ("train_teacher_endpoint", *TRAIN, "--config.teacher_endpoint=localhost:8000", "is not an http(s) URL"),
    ("train_served_preflight", *TRAIN, "--config.teacher_endpoint=http://127.0.0.1:9/v1",
     "--config.served_teacher.preflight=maybe", "served_teacher.preflight must be one of"),
    ("train_missing_teacher", *TRAIN, "--config.teacher={d}/none", "config.teacher: checkpoint dir"),
    ("train_second_teacher", "launch/train.py", "--config=configs/multi_teacher.py:runlocal", "--workdir={d}/run",
     "--config.teachers.pair3.checkpoint={d}/none", "does not exist"),
    # stopping.py
    ("loops_student", "study/loops.py", "--config=configs/smollm2.py", "--student={d}/none",
     "--samples={d}/ok.jsonl", "is not an HF directory"),
    ("loops_no_student_rows", "study/loops.py", "--config=configs/smollm2.py", "--student={student}",
     "--config.teacher={teacher}", "--samples={d}/ok.jsonl", "holds no student responses"),
    ("stopping_prompts", "study/stopping.py", "--config=configs/smollm2.py", "--prompts=0", "--prompts=0 must be >= 1"),
    ("stopping_not_jsonl", "study/stopping.py", "--config=configs/pair1.py", "data.source='arithmetic'"),
    ("stopping_unprepared", "study/stopping.py", "--config=configs/smollm2.py", "--config.prepare.dir={d}/none",
     "is not an HF directory"),
    # bench/compare.py
    ("compare_no_rev", "launch/bench/compare.py", "--rev is required"),
    ("engine_bench_checkpoint", "launch/bench/engine.py", "--checkpoint={d}/none", "has no config.json"),
    ("malloc_bench_steps", "launch/bench/malloc.py", "--steps=3", "--steps=3 leaves no step after --warmup=3"),
    ("malloc_bench_out_folder", "launch/bench/malloc.py", "--out={d}/nope/m.json", "its folder does not exist"),
    ("engine_bench_out_folder", "launch/bench/engine.py", "--out={d}/nope/e.json", "folder"),
    ("compare_bad_rev", "launch/bench/compare.py", "--rev=no-such-revision", "give --rev as a commit"),
    ("compare_out_folder", "launch/bench/compare.py", "--rev=HEAD", "--out={d}/nope/c.json",
     "its folder does not exist"),
    # serve_teacher.py
    ("serve_no_model", "launch/serve_teacher.py", "give exactly one of --config"),
    ("serve_bad_port", "launch/serve_teacher.py", "--checkpoint={teacher}", "--port=70000", "--port in 0..65535"),
    ("serve_logits_chunk", "launch/serve_teacher.py", "--checkpoint={teacher}", "--logits_chunk=-5",
     "--logits_chunk must be >= 0"),
    ("serve_missing_checkpoint", "launch/serve_teacher.py", "--checkpoint=/no/such/dir", "does not exist"),
    # sample.py
    ("sample_missing", *SAMPLE, "--checkpoint=/no/such/dir", "does not exist"),
    ("sample_no_checkpoint", *SAMPLE, "--checkpoint is required"),
    ("sample_prompt_ids", "launch/sample.py", "--checkpoint={student}", "--prompt_ids=a,b", "--json",
     "--prompt_ids must be comma-separated integers"),
    ("sample_unknown_character", "launch/sample.py", "--checkpoint={student}", "--prompt=12*3", "--json",
     "outside the tokenizer's vocabulary: '*'"),
    ("sample_positions", "launch/sample.py", "--checkpoint={student}", "--prompt_ids=3", "--max_new_tokens=99999",
     "--json", "max_position_embeddings"),
    ("sample_prompt_format", "launch/sample.py", "--checkpoint={student}", "--prompt=12+3", "--json",
     "--prompt_format=Q: {{question}}", "--prompt_format='Q: {question}' does not render"),
    ("sample_nan", *SAMPLE, "--checkpoint={bad}", "non-finite"),
    ("sample_config_list", *SAMPLE, "--checkpoint={bad}", "holds a JSON list"),
    ("sample_truncated_weights", *SAMPLE, "--checkpoint={bad}", "model.safetensors"),
    # calibrate.py
    ("calibrate_missing", "launch/calibrate.py", "--results={d}/none.jsonl", "--out={d}/b.json", "does not exist"),
    ("calibrate_garbage_line", "launch/calibrate.py", "--results={d}/garbage.jsonl", "--out={d}/b.json",
     "garbage.jsonl:2"),
    ("calibrate_no_pair", "launch/calibrate.py", "--results={d}/nopair.jsonl", "--out={d}/b.json",
     "missing field 'pair'"),
    ("calibrate_tolerance", "launch/calibrate.py", "--results={d}/ok.jsonl", "--out={d}/b.json", "--tolerance=-1",
     "--tolerance=-1"),
    ("calibrate_quality_relative", "launch/calibrate.py", "--results={d}/ok.jsonl", "--out={d}/b.json",
     "--quality=reverse_kl", "--relative", "already relative"),
    ("calibrate_quality_missing", "launch/calibrate.py", "--results={d}/ok.jsonl", "--out={d}/b.json",
     "--quality=reverse_kl", "train.eval_sampled=True"),
    ("calibrate_holdout", "launch/calibrate.py", "--results={d}/ok.jsonl", "--out={d}/b.json", "--holdout=nope",
     "--holdout names points"),
    ("calibrate_pair_test_list", "launch/calibrate.py", "--results={d}/ok.jsonl", "--out={d}/b.json",
     "--pair_test={d}/list.json", "per-pair test file"),
    ("pair_budgets_one_seed", "study/pair_budgets.py", "--results={d}/ok.jsonl", "--out={d}/pb.json",
     "missing or short"),
    ("pair_budgets_out_folder", "study/pair_budgets.py", "--results={d}/ok.jsonl", "--out={d}/nope/pb.json",
     "its folder does not exist"),
    ("calibrate_admission_k3_missing", "launch/calibrate.py", "--results={d}/ok.jsonl", "--out={d}/b.json",
     "--admission_k3={d}/none.jsonl", "admission k3 file"),
    ("calibrate_admission_k3_fields", "launch/calibrate.py", "--results={d}/ok.jsonl", "--out={d}/b.json",
     "--admission_k3={d}/ok.jsonl", "missing field 'overrides'"),
    ("admission_k3_prompts", "launch/admission_k3.py", "--results={d}/none.jsonl", "--prompts=0",
     "--prompts=0 must be >= 1"),
    ("admission_k3_out_is_input", "launch/admission_k3.py", "--results={d}/ok.jsonl", "--out={d}/ok.jsonl",
     "is also one of the command's inputs"),
    ("calibrate_directory", "launch/calibrate.py", "--results={d}", "--out={d}/b.json", "is a directory"),
    ("calibrate_out_is_input", "launch/calibrate.py", "--results={d}/ok.jsonl", "--out={d}/ok.jsonl",
     "ok.jsonl' is also one of the command's inputs"),
    ("calibrate_out_folder", "launch/calibrate.py", "--results={d}/ok.jsonl", "--out={d}/nope/b.json",
     "its folder"),
    ("calibrate_out_directory", "launch/calibrate.py", "--results={d}/ok.jsonl", "--out={d}", "is a directory"),
    ("calibrate_nothing_usable", "launch/calibrate.py", "--results={d}/ok.jsonl", "--out={d}/b.json",
     "ok.jsonl (1 rows)"),
    # admit.py (the budget is checked before anything is measured)
    ("admit_budget_list", "launch/admit.py", "--config=configs/pair1.py", "--budget={d}/list.json",
     "holds a JSON list"),
    ("admit_no_budget", "launch/admit.py", "--config=configs/pair1.py", "--config.admission_budget=",
     "pass --budget=PATH"),
    ("admit_config_budget_missing", "launch/admit.py", "--config=configs/pair1.py",
     "--config.admission_budget={d}/none.json", "does not exist"),
    ("admit_budget_keys", "launch/admit.py", "--config=configs/pair1.py", "--budget={d}/nokeys.json", "'budgets'"),
    ("admit_budget_section", "launch/admit.py", "--config=configs/pair1.py", "--budget={d}/badsection.json",
     "'horizon_test' must be an object"),
    ("admit_budget_conversion", "launch/admit.py", "--config=configs/pair1.py", "--budget={d}/badconversion.json",
     "'k3_conversion' must be an object with 'scale', 'by_steps'"),
    ("admit_budget_truncated", "launch/admit.py", "--config=configs/pair1.py", "--budget={d}/truncated.json",
     "not valid JSON"),
    ("admit_prompts", "launch/admit.py", "--config=configs/pair1.py", "--budget={d}/budget.json", "--prompts=0",
     "--prompts=0"),
    # a flag mistake and a file mistake together: the flag is named first (no I/O needed to find it)
    ("admit_flag_before_file", "launch/admit.py", "--config=configs/pair1.py", "--budget={d}/list.json",
     "--staleness=-2", "staleness_steps must be an integer >= 0"),
    ("admit_candidates_flag_before_file", "launch/admit.py", "--config=configs/pair1.py", "--budget={d}/list.json",
     "--candidates=weights=fp8", "--device_memory_gb=0", "--device_memory_gb must be > 0"),
    # The same for every other script that takes flags and files: a wrong flag or config value beside a missing or
    # wrong file ({d}/none does not exist, {d}/file is a file); the flag is what the one error line names.
    ("train_flag_before_file", *TRAIN, "--config.teacher={d}/none", "--config.train.steps=-1",
     "train.steps must be an integer >= 0"),
    ("sample_flag_before_file", "launch/sample.py", "--checkpoint={d}/none", "--prompt_ids=3", "--temperature=-1",
     "--json", "temperature must be >= 0"),
    ("calibrate_flag_before_file", "launch/calibrate.py", "--results={d}/none.jsonl", "--out={d}/b.json",
     "--tolerance=-1", "--tolerance=-1 must be in (0, 1)"),
    ("report_flag_before_file", "study/report.py", "--results={d}/none.jsonl", "--budget={d}/truncated.json",
     "--prompts=0", "--prompts=0 >= 1"),
    ("plan_flag_before_file", "launch/plan_memory.py", "--config=configs/real/qwen3_1p7b_to_0p6b.py",
     "--config.teacher={d}/none", "--config.train.batch_size=0", "train.batch_size"),
    ("plan_config_flag_before_file", "launch/plan_memory.py", "--config=configs/pair1.py",
     "--config.teacher={d}/none", "--config.train.logits_chunk=-1", "train.logits_chunk"),
    ("plan_no_config", "launch/plan_memory.py", "--json", "--config is required"),
    ("plan_devices", "launch/plan_memory.py", "--config=configs/pair1.py", "--devices=0",
     "--devices must be an integer >= 1"),
    ("plan_device_memory", "launch/plan_memory.py", "--config=configs/pair1.py", "--device_memory_gb=0",
     "--device_memory_gb must be > 0"),
    ("prefix_shift_flag_before_file", "study/prefix_shift.py", "--config=configs/pair1.py",
     "--config.teacher={d}/none", "--noise=abc", "--out={d}/file", "--noise must be comma-separated numbers"),
    ("sensitivity_flag_before_file", "launch/sensitivity.py", "--config=configs/pair1.py",
     "--config.teacher={d}/none", "--weights=int1", "--out={d}/file", "'int1' is not one of"),
    ("sensitivity_out_is_file", "launch/sensitivity.py", "--config=configs/pair1.py", "--out={d}/ok.jsonl",
     "is a file; this command writes a folder there"),
    ("prune_flag_before_file", "launch/prune.py", "--model={d}/none", "--keep_layers=0", "--out={d}/p",
     "--keep_layers must be a positive integer, got 0"),
    ("export_flag_before_file", "launch/export.py", "--workdir={d}/none", "--out={d}/e", "--step=-1",
     "--step must be a checkpoint step >= 0"),
    ("ttq_flag_before_file", "launch/bench/time_to_quality.py", "--config=configs/pair1.py",
     "--config.teacher={d}/none", "--target=1.5", "--target must be in (0, 1]"),
    ("build_pairs_flag_before_file", "study/build_pairs.py", "--pairs=pair9", "--out={d}/file", "unknown pair 'pair9'"),
    ("build_pairs_out_file", "study/build_pairs.py", "--pairs=pair1", "--out={d}/file",
     "is a file; this command writes a folder there"),
    ("report_budget_truncated", "study/report.py", "--results={d}/ok.jsonl", "--budget={d}/truncated.json",
     "--out={d}/report", "budget file"),
    ("report_out_file", "study/report.py", "--results={d}/ok.jsonl", "--out={d}/file", "is a file"),
    ("report_validation_list", "study/report.py", "--results={d}/ok.jsonl", "--validation={d}/list.json",
     "--out={d}/report", "holds a JSON list"),
    ("report_heldout_alone", "study/report.py", "--results={d}/ok.jsonl", "--heldout_results={d}/ok.jsonl",
     "--out={d}/report", "only read with --validate"),
    ("report_seed_means_alone", "study/report.py", "--results={d}/ok.jsonl", "--seed_means", "--out={d}/report",
     "--seed_means and --admission_k3 are only read with --validate"),
    ("report_exclude_unknown", "study/report.py", "--results={d}/ok.jsonl", "--validate",
     "--heldout_results={d}/ok.jsonl", "--heldout_exclude=pair9/x", "--budget=results/budget.json", "--out={d}/report",
     "--heldout_exclude names"),
    ("heldout_screen_neither", "study/heldout_screen.py", "--out_dir={d}/out", "exactly one of --pair"),
    ("heldout_screen_pair", "study/heldout_screen.py", "--pair=pair9", "--out_dir={d}/out",
     "--pair='pair9' is not one of"),
    ("heldout_screen_no_screens", "study/heldout_screen.py", "--select", "--out_dir={d}", "no screen file"),
    ("heldout_screen_out_file", "study/heldout_screen.py", "--pair=pair1", "--out_dir={d}/file",
     "is a file; this command writes a folder there"),
    ("span_boundaries_step", "study/span_boundaries.py", "--samples=results/gemma3/marginal_run_seed0/samples.jsonl",
     "--step=7", "--out={d}/b.json", "no student sample at step 7"),
    ("transfer_no_main_run", "study/transfer.py", "--validation={d}/v.json", "--out={d}/t.json", "give --main_run"),
    ("transfer_no_validation", "study/transfer.py", "--validation={d}/none.json", "--main_run={d}/t.json",
     "--out={d}/out.json", "none.json"),
    ("transfer_out_is_input", "study/transfer.py", "--validation={d}/v.json", "--main_run={d}/t.json",
     "--out={d}/v.json", "is also one of the command's inputs"),
    ("heldout_screen_plan", "study/heldout_screen.py", "--plan=nope", "--select", "--out_dir={d}",
     "no held-out validation plan 'nope'"),
    ("heldout_screen_plan_pair", "study/heldout_screen.py", "--plan=smollm2", "--pair=pair1", "--out_dir={d}/out",
     "not one of the smollm2 plan's pairs"),
    ("solved_sets_run_spec", "study/solved_sets.py", "--config=configs/pair2.py", "--run={d}/none",
     "must be NAME=DIR"),
    ("solved_sets_flag_before_file", "study/solved_sets.py", "--config=configs/pair2.py", "--run=a={d}/none",
     "--problems=0", "--problems=0 must be >= 1"),
    ("results_tables_missing", "study/results_tables.py", "--results_dir={d}/nope", "is not a folder"),
    ("results_tables_out_folder", "study/results_tables.py", "--out={d}/nope/results.md", "its folder does not exist"),
    ("results_tables_out_directory", "study/results_tables.py", "--out={d}", "is a directory"),
    ("pair_budgets_out_is_input", "study/pair_budgets.py", "--results={d}/ok.jsonl", "--out={d}/ok.jsonl",
     "is also one of the command's inputs"),
    ("host_rss_args", "launch/bench/host_rss.py", "--name=x", "--train_args=--workdir={d}/a",
     "must be --config=FILE and --config.x=v arguments only"),
    ("host_rss_out_folder", "launch/bench/host_rss.py", "--name=x", "--train_args=--config=configs/pair1.py",
     "--out={d}/nope/rows.jsonl", "its folder does not exist"),
    # the other scripts
    ("sweep_missing_config", "launch/sweep.py", "--config=configs/sweeps/nope.py", "--workdir={d}/sweep",
     "does not exist or cannot be read; give a path like configs/sweeps/quantization.py"),
    ("sweep_unknown_field", "launch/sweep.py", "--config=configs/sweeps/noise.py", "--config.stepz=1",
     "--workdir={d}/file", "no field 'stepz'"),  # and a workdir that is a file: the field is named first
    ("sweep_pair_config", "launch/sweep.py", "--config=configs/pair1.py:runlocal", "--workdir={d}/sweep",
     "is not a sweep config"),
    ("train_config_syntax", "launch/train.py", "--config={d}/syntax.py", "--workdir={d}/run",
     "syntax.py' is not valid Python"),
    ("train_config_no_get_config", "launch/train.py", "--config={d}/noget.py", "--workdir={d}/run",
     "the file defines no get_config"),
    ("train_config_dict", "launch/train.py", "--config={d}/dict.py", "--workdir={d}/run", "returned a dict"),
    ("train_config_no_section", "launch/train.py", "--config={d}/partial.py", "--workdir={d}/run",
     "--config has no 'distributed' field"),
    ("train_recipe_truncated", "launch/train.py", "--config=configs/smollm2.py:recipe={d}/truncated.json",
     "--workdir={d}/run", "truncated.json' cannot be read as JSON"),
    ("train_recipe_list", "launch/train.py", "--config=configs/smollm2.py:recipe={d}/list.json", "--workdir={d}/run",
     "has no 'rules' list of [regex, precision] pairs"),
    ("plan_unknown_model", "launch/plan_memory.py", "--config=configs/real/qwen3_1p7b_to_0p6b.py",
     "--config.teacher=qwen9", "config.teacher='qwen9'"),
    ("plan_rollout_devices", "launch/plan_memory.py", "--config=configs/real/qwen3_1p7b_to_0p6b.py", "--devices=2",
     "--config.rollout.placement=disaggregated", "--config.rollout.devices=2", "rollout.devices"),
    ("admit_candidate_field", "launch/admit.py", "--config=configs/pair1.py", "--budget={d}/budget.json",
     "--candidates=weights=fp8;kv_cache=fp8,stalenes=2", "unknown rollout field(s) ['stalenes']"),
    ("ttq_target", "launch/bench/time_to_quality.py", "--config=configs/pair1.py", "--target=1.5",
     "--workdir={d}/ttq", "--target must be in (0, 1]"),
    ("prefix_shift_noise", "study/prefix_shift.py", "--config=configs/pair1.py", "--noise=abc", "--out={d}/ps",
     "--noise"),
    ("sensitivity_weights", "launch/sensitivity.py", "--config=configs/pair1.py", "--weights=int1",
     "--out={d}/sens", "int1"),
    ("build_pairs_unknown", "study/build_pairs.py", "--pairs=pair9", "--out={d}/pairs", "pair9"),
    # real models: GGUF import, pruning, a config that prepares its pair, prompt files without prompts
    ("prepare_model_missing_package", "launch/prepare_model.py", "--gguf=no-such-package-opd", "--out={d}/m",
     "'no-such-package-opd' is not installed"),
    ("prepare_model_corrupt", "launch/prepare_model.py", "--gguf={d}/garbage.gguf", "--out={d}/m",
     "cannot be read as GGUF"),
    ("prepare_model_architecture", "launch/prepare_model.py", "--gguf={d}/falcon.gguf", "--out={d}/m",
     "architecture 'falcon' is not supported"),
    ("prune_keep_range", "launch/prune.py", "--model={student}", "--keep_layers=99", "--out={d}/p", "out of range"),
    ("prune_prompt_file", "launch/prune.py", "--model={student}", "--keep_layers=1", "--out={d}/p",
     "--prompts_file={d}/noprompt.jsonl", "noprompt.jsonl:1: each line needs a non-empty string 'prompt'"),
    ("train_jsonl_no_prompt", *TRAIN, *TINY, "--config.data.source=jsonl",
     "--config.data.train_file={d}/noprompt.jsonl", "--config.data.heldout_file={d}/noprompt.jsonl",
     "noprompt.jsonl:1: each line needs"),
    ("gguf_parity_texts", "study/gguf_parity.py", "--gguf={d}/garbage.gguf", "--model={student}", "--texts=0",
     "--texts must be >= 1"),
    ("build_chat_prompts_teacher", "study/build_chat_prompts.py", "--teacher={d}/none", "does not exist"),
    ("cross_family_probe_models", "study/cross_family_probe.py", "--gemma={d}/none", "is not a prepared model"),
    ("base_student_probe_models", "study/base_student_probe.py", "--gemma={d}/none", "is not a prepared model"),
    ("teacher_answer_probe_model", "study/teacher_answer_probe.py", "--samples={d}/none.jsonl", "--teacher={d}/none",
     "is not a prepared model"),
    ("teacher_sft_baseline_model", "study/teacher_sft_baseline.py", "--teacher={d}/none", "is not a prepared model"),
    ("build_french_words_out", "study/build_french_words.py", "--out={d}/garbage.jsonl", "is a file"),
    ("train_real_missing_package", "launch/train.py", "--config=configs/smollm2.py:runlocal", "--workdir={d}/run",
     "--config.prepare.gguf=no-such-package-opd", "--config.prepare.dir={d}/models", "is not installed"),
    ("train_cross_missing_package", "launch/train.py", "--config=configs/gemma3_to_smollm2.py:runlocal",
     "--workdir={d}/run", "--config.prepare.gguf=no-such-package-opd", "--config.prepare.dir={d}/models",
     "is not installed"),
    # train.py: a teacher of another tokenizer (opd_jax/crosstok)
    ("train_cross_format", *TRAIN, "--config.cross_tokenizer.enabled=True",
     "--config.cross_tokenizer.teacher_format=Q: {{question}}", "does not render"),
    ("train_cross_objective", *TRAIN, "--config.cross_tokenizer.enabled=True", "--config.objective.name=forward_kl",
     "next-character marginals"),
    ("train_cross_lengths", *TRAIN, "--config.cross_tokenizer.enabled=True",
     "--config.cross_tokenizer.max_teacher_response_tokens=4096", "exceed its max_position_embeddings"),
    # gke_launch.py: the manifest's settings, before anything is rendered or submitted
    ("gke_accelerator", "launch/gke_launch.py", "--name=run", "--accelerator=tpu-v4-8", "--image=i",
     "--config=configs/pair1.py", "--bucket=b", "--workdir=/gcs/b/run", "--dry_run", "--accelerator='tpu-v4-8'"),
    ("gke_workdir_unshared", "launch/gke_launch.py", "--name=run", "--accelerator=tpu-v6e-8", "--image=i",
     "--config=configs/pair1.py", "--bucket=b", "--workdir=/tmp/run", "--dry_run", "is not under /gcs/b/"),
    ("gke_gpu_nodes", "launch/gke_launch.py", "--name=run", "--accelerator=nvidia-h100-80gb:8", "--image=i",
     "--config=configs/pair1.py", "--bucket=b", "--workdir=/gcs/b/run", "--dry_run", "--nodes must be >= 1"),
]


def _damaged_student(d: str, student: str, how: str) -> str:
  bad = os.path.join(d, "bad")
  shutil.copytree(student, bad)
  weights = os.path.join(bad, "model.safetensors")
  if how == "config_list":
    with open(os.path.join(bad, "config.json"), "w") as f:
      json.dump([1, 2], f)
  elif how == "truncated_weights":
    with open(weights, "r+b") as f:
      f.truncate(os.path.getsize(weights) // 2)
  elif how == "nan":
    from safetensors.numpy import load_file, save_file
    tensors = load_file(weights)
    name = sorted(tensors)[0]
    tensors[name] = np.full_like(tensors[name], np.nan)
    save_file(tensors, weights, metadata={"format": "pt"})
  return bad


def _setup(case_id: str, d: str, pair: dict) -> dict:
  """Writes the case's inputs into d; returns the placeholders of its arguments."""
  with open(os.path.join(d, "file"), "w") as f:
    f.write("not a directory\n")
  with open(os.path.join(d, "bad.jsonl"), "wb") as f:
    f.write(b'{"prompt": "1+1=", "answer": "2"}\n\xff\xfe\n')
  row = {"pair": "pair1", "point": "baseline", "status": "ok", "final_accuracy": 0.5, "best_accuracy": 0.5,
         "mismatch": {"mismatch/k3": 0.0}}
  with open(os.path.join(d, "garbage.jsonl"), "w") as f:
    f.write(json.dumps(row) + "\nnot json\n" + json.dumps(row) + "\n")
  with open(os.path.join(d, "noprompt.jsonl"), "w") as f:
    f.write('{"answer": "2"}\n')
  with open(os.path.join(d, "garbage.gguf"), "wb") as f:
    f.write(b"GGUF" + bytes(range(64)))
  if case_id == "prepare_model_architecture":
    from tests.gguf_files import write_gguf
    write_gguf(os.path.join(d, "falcon.gguf"), "falcon")
  with open(os.path.join(d, "garbage_problems.jsonl"), "w") as f:
    f.write('{"prompt": "1+1=", "answer": "2"}\nnot json\n')
  with open(os.path.join(d, "nopair.jsonl"), "w") as f:
    f.write(json.dumps({k: v for k, v in row.items() if k != "pair"}) + "\n")
  with open(os.path.join(d, "ok.jsonl"), "w") as f:
    f.write(json.dumps(row) + "\n")
  budget = {"scale": "k3", "budgets": {"pooled": {"budget": 1e-3, "interval": [5e-4, 2e-3],
                                                   "bootstrap_budgets": [1e-3]}}}
  for name, value in (("list.json", [1, 2]), ("nokeys.json", {"scale": "k3"}), ("budget.json", budget),
                      ("badsection.json", {**budget, "horizon_test": "moves"}),  # hand edits
                      ("badconversion.json", {**budget, "k3_conversion": "1.3"})):
    with open(os.path.join(d, name), "w") as f:
      json.dump(value, f)
  with open(os.path.join(d, "truncated.json"), "w") as f:
    f.write('{"scale": "k3", "budgets": {"pooled": {"budg')
  for name, text in (("syntax.py", "def get_config(:\n  pass\n"), ("noget.py", "X = 1\n"),
                     ("dict.py", "def get_config(arg=None):\n  return {'pair': 'x'}\n"),
                     ("partial.py", "import ml_collections\ndef get_config(arg=None):\n"
                                    "  return ml_collections.ConfigDict({'pair': 'x', 'train': {}})\n")):
    with open(os.path.join(d, name), "w") as f:
      f.write(text)
  values = {"d": d, **pair}
  damage = next((how for how in ("config_list", "truncated_weights", "nan") if how in case_id), None)
  if damage:
    values["bad"] = _damaged_student(d, pair["student"], damage)
  return values


@pytest.fixture(scope="module")
def outcomes(request, tiny_pair, tmp_path_factory):
  """Only the cases this session selected (pytest -k ...) run: each a process of its own, forked by
  tests/preloaded.py from one process that has imported jax and the package already (that import is ~2 s of
  each case's ~2.5 s)."""
  selected = {item.callspec.params["case"][0] for item in request.session.items
              if item.module is request.module and getattr(item, "originalname", "") == "test_bad_input"}
  root = str(tmp_path_factory.mktemp("error_contract"))
  jobs, cases = [], [case for case in CASES if case[0] in selected]
  for case in cases:
    case_id, *args, _ = case
    d = os.path.join(root, case_id)
    os.makedirs(d)
    values = _setup(case_id, d, tiny_pair)
    argv = [a.format(**values) for a in args]
    if argv[0].startswith("study/"):  # study scripts run as modules from the repository root
      argv[:1] = ["-m", argv[0][:-len(".py")].replace("/", ".")]
    jobs.append({"argv": argv, "before": sorted(os.listdir(d)),
                 "stdout": os.path.join(root, case_id + ".out"), "stderr": os.path.join(root, case_id + ".err")})
  jobs_file = os.path.join(root, "jobs.json")
  with open(jobs_file, "w") as f:
    json.dump(jobs, f)
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "", "OPD_JAX_COMPILATION_CACHE": "off"}
  launcher = subprocess.run([sys.executable, os.path.join(REPO, "tests", "preloaded.py"), jobs_file,
                             "--parallel=2", "--timeout_s=300"], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=900)
  assert launcher.returncode == 0, launcher.stderr[-3000:]
  outcomes = {}
  for case, job, result in zip(cases, jobs, json.loads(launcher.stdout)):
    with open(job["stderr"]) as f:
      stderr = f.read()
    d = os.path.join(root, case[0])
    outcomes[case[0]] = (subprocess.CompletedProcess(job["argv"], result["returncode"], "", stderr),
                         job["before"], sorted(os.listdir(d)))
  return outcomes


def test_the_table_covers_every_launch_script_and_study_script():
  scripts = {case[1] for case in CASES}
  commands = {f"{folder}/{s}" for folder in ("launch", "study") for s in os.listdir(os.path.join(REPO, folder))
              if s.endswith(".py") and not s.startswith(("_", "xm_", "export"))}
  assert commands <= scripts, commands - scripts  # export / xm_launch: their own tests
  assert len(CASES) >= 40 and len({c[0] for c in CASES}) == len(CASES)


# Scripts that take both flags (or config values) and files -> their case of a flag mistake beside a file
# mistake (sweep: a config field is checked while the flags are parsed, before its --workdir is looked at).
FLAG_BEFORE_FILE = {"train": "train_flag_before_file", "sample": "sample_flag_before_file",
                    "calibrate": "calibrate_flag_before_file", "report": "report_flag_before_file",
                    "sweep": "sweep_unknown_field", "plan_memory": "plan_flag_before_file",
                    "prefix_shift": "prefix_shift_flag_before_file", "sensitivity": "sensitivity_flag_before_file",
                    "prune": "prune_flag_before_file", "export": "export_flag_before_file",
                    "bench/time_to_quality": "ttq_flag_before_file", "build_pairs": "build_pairs_flag_before_file",
                    "gguf_parity": "gguf_parity_texts", "admit": "admit_flag_before_file",
                    "solved_sets": "solved_sets_flag_before_file", "admission_k3": "admission_k3_prompts"}


def test_every_script_with_flags_and_files_names_the_flag_first():
  cases = {case[0]: case for case in CASES}
  for script, case_id in FLAG_BEFORE_FILE.items():
    assert cases[case_id][1] in (f"launch/{script}.py", f"study/{script}.py"), case_id


# The fast tier (pytest -m "not slow") runs these: a flag mistake, a file mistake, a config-field mistake.
FAST_CASES = {"train_unknown_field", "calibrate_missing", "plan_flag_before_file", "train_workdir_file"}


@pytest.mark.parametrize("case", [pytest.param(c, id=c[0], marks=() if c[0] in FAST_CASES else pytest.mark.slow)
                                  for c in CASES])
def test_bad_input(case, outcomes):
  result, before, after = outcomes[case[0]]
  errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
  report = f"exit {result.returncode}\n{result.stderr[-3000:]}"
  assert result.returncode == 2, report
  assert len(errors) == 1 and case[-1] in errors[0], report
  assert "Traceback" not in result.stderr, report
  assert after == before, f"left behind: {sorted(set(after) - set(before))}"
