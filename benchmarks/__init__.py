"""minigpt's benchmarks: scripts run from the project root (`python benchmarks/<name>.py`), each writing
benchmarks/results/<name>/<machine class>.json with a manifest; docs/benchmarks.md says what each measures.

By purpose:
- speed: attention_precision, compile_step, dropout_cost, muon_precision, precision_auto, profile_step,
  train_throughput, watchdog_cost, harness, exp_run_time, sweep_workers, default_tier, gpu_check;
- quality: quality_budget, baselines_ladder, mixture_orders, dynamic_settings, precision_curves;
- calibration (the thresholds of preflight and the watchdogs): preflight_false_alarms, watchdog_false_alarms.

Shared code: bench_common (no script imports another); tables renders the generated tables from the results.
"""
