"""Built-in model families for `--model NAME[:FLAVOUR]` (families.py), their flavours
(flavours.py), the Llama-style decoder (llama.py) and stage boundaries balanced on
profiled per-layer cost (balance.py). The GPT stays in executor/compute/model.py."""
