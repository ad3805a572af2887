"""Bad input stays one line (issue 35 item 2): every malformed model name or override, and
every bad value of the options this issue added, ends in one line on stderr and exit
code 2, for `train` and `profile`, before any work starts. `hf:gpt2?n_layer=abc` ended in
a 73-line traceback and exit 1 (transformers refuses a config with its own error types,
over several lines)."""
import importlib.util

import pytest
from typer.testing import CliRunner

from recycle.cli import app

NO_HF = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                           reason="transformers (the hf extra) is not installed")
SPLIT = "examples.dropout_lm:DropoutGPT?split="
BAD = [
    ("hf:gpt2?n_layer=abc", "GPT2Config refuses it: Validation error for field 'n_layer'"),
    ("hf:gpt2?n_layer=1.5", "expected int, got float"),
    ("hf:gpt2?resid_pdrop=abc", "Field 'resid_pdrop'"),
    ("hf:llama?num_attention_heads=3", "is not a multiple of the number of attention heads"),
    ("hf:gpt2?n_layer=2&n_layer=3", "n_layer given more than once"),
    ("hf:gpt2?n_layer", "overrides must read key=value"),
    ("hf:gpt2?n_wings=2", "has no field 'n_wings'"),
    ("hf:gpt2?resid_pdrop=2", "dropout probability has to be between 0 and 1"),
    ("hf:", "neither a config.json nor a transformers model type"),
    (SPLIT, "give split=PIECE"),
    (SPLIT + "emb,,head", "give split=PIECE"),
    (SPLIT + "emb,nosuch", "no submodule 'nosuch'"),
    ("examples.dropout_lm:workload?split=emb", "not an nn.Module"),
]


@pytest.mark.parametrize("command", ["train", "profile"])
@pytest.mark.parametrize("model,says", [
    pytest.param(m, s, id=m, marks=[NO_HF] if m.startswith("hf:") else []) for m, s in BAD])
def test_a_malformed_model_is_one_line_exit_2(command, model, says):
    r = CliRunner().invoke(app, [command, "--model", model, "-s", "2"])
    assert r.exit_code == 2, (r.exit_code, r.output, repr(r.exception))
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], r.output
    assert "Traceback" not in r.output
