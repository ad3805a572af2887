"""The failure event's hot path at thousands of workers: memoised renumbering of cached
plans (mapping.py) and JSON assembled from memoised per-worker parts (encode.py). Both
rely on plans being data nobody mutates (planner/plan.py): parts are memoised by object
identity, and equal results are the same objects from one version to the next."""
