"""launch/bench/same_metrics.py's comparison: timings aside, every key and value of every row must match."""

from launch.bench.same_metrics import differences


def test_identical_runs_differ_only_in_timings():
  base = [{"step": 0, "eval/accuracy": 0.5, "eval/seconds": 3.0}, {"step": 1, "loss": 0.25, "perf/step_s": 1.0}]
  new = [{"step": 0, "eval/accuracy": 0.5, "eval/seconds": 9.0}, {"step": 1, "loss": 0.25, "perf/step_s": 2.0}]
  assert differences(base, new) == (4, [])  # step, accuracy; step, loss


def test_a_value_a_key_or_a_row_that_differs_is_named():
  base = [{"step": 0, "eval/accuracy": 0.5}, {"step": 1, "loss": 0.25, "k3": 1e-9}]
  new = [{"step": 0, "eval/accuracy": 0.5}, {"step": 1, "loss": 0.2500001, "new/metric": 1.0}]
  assert differences(base, new)[1] == ["step 1: key 'k3' only on REV", "step 1: key 'new/metric' only here",
                                       "step 1: loss 0.25 on REV, 0.2500001 here"]
  assert differences(base, new[:1])[1] == ["2 rows on REV, 1 here"]


def test_the_training_time_is_the_last_rows():
  from launch.bench.same_metrics import train_seconds
  rows = [{"step": 0, "eval/seconds": 3.0}, {"step": 5, "eval/accuracy": 0.5, "time/train_s": 10.0},
          {"step": 10, "eval/accuracy": 0.75, "time/train_s": 21.5}, {"step": 10, "loss": 0.25}]
  assert train_seconds(rows) == 21.5
