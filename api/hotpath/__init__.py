"""The hot path at thousands of workers. The failure event's: memoised renumbering of
cached plans (mapping.py) and JSON assembled from memoised per-worker parts (encode.py),
both relying on plans being data nobody mutates (planner/plan.py): parts are memoised by
object identity, and equal results are the same objects from one version to the next. The
long-polls': the shares they answer, built once per version (views.py)."""
