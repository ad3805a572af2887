"""The planner's benchmarks (`recycle bench planner`): plain functions that print through the console they are given."""
