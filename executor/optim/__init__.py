"""The optimizer step's parts shared by the workers (runtime/steps/stepper.py), the in-process
runner (compute/one_process/local.py) and the reference (compute/one_process/reference.py): the learning-rate
schedule, clipping by the global gradient norm, and the pre-step copies rollback uses."""
