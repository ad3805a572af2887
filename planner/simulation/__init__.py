"""Failure-trace simulator: recovery policies compared on the same trace (docs/simulator.md).

  trace.py     traces from files (spot format, fail-stop format), node-to-worker placement,
               synthetic traces (fixed interval, exponential, spot-like bursts)
  costs.py     periods from the planner: ReCycle's per failed set, single pipelines
  presets.py   GPT-3 shapes as job specs, from FLOP counts (estimates)
  base.py      what every policy shares (Params, Context, Policy)
  failure_model.py  failure causes and rates (a cluster's record), sampled into traces
  shape_costs.py    the shapes' periods; throughput_bound.py: the limit's bound
  policies/    the policies by name and their cost models: recycle-fixed and swift-replay
               (__init__.py), checkpoint.py, bamboo.py, bamboo_reform.py (Bamboo
               re-forming pipelines), elastic.py (recycle-roles), shaped.py (recycle,
               recycle-short), limit.py (the limit and shape-limit)
  engine.py    integrating a policy's throughput over a trace
  compare.py   every policy on one trace
  report.py    table, JSON, PNG and HTML plots
  cli.py       `recycle simulate`
"""
