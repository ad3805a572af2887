"""Shapes: the partition of the model's units into stages follows the live workers
(docs/design.md section 12; docs/planner.md, "Shapes")."""
