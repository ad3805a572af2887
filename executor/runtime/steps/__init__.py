"""One iteration of one stage: its runtime (module, optimizer, stepper, data:
stage_runtime.py), the lowered steps through a handler table (iteration.py,
interpreter.py), the gradient all-reduce and tied weights (grad_sum.py, tied.py), the
optimizer step (stepper.py), batches, compute timing and the model's own errors."""
