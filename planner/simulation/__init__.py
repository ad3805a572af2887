"""Failure-trace simulator: recovery policies compared on the same trace (docs/simulator.md).

  trace.py     traces from files (spot format, fail-stop format), node-to-worker placement,
               synthetic traces (fixed interval, exponential, spot-like bursts)
  costs.py     periods from the planner: ReCycle's per failed set, single pipelines
  presets.py   GPT-3 shapes as job specs, from FLOP counts (estimates)
  base.py      what every policy shares (Params, Context, Policy)
  policies.py  the policies and their cost models (bamboo.py, checkpoint.py, elastic.py: the
               recycle policy with roles, bamboo_reform.py: Bamboo re-forming pipelines)
  engine.py    integrating a policy's throughput over a trace
  compare.py   every policy on one trace
  report.py    table, JSON, PNG and HTML plots
  cli.py       `recycle simulate`
"""
