"""`recycle data prepare` + `recycle train --data FILE`: real text, byte-level tokens,
micro-batches that depend on (iteration, g) only, exact under a SIGKILL."""
import dataclasses
import os

import pytest
import torch
from typer.testing import CliRunner

from executor.compute.config import TrainingSettings
from executor.compute.model import DEFAULT_WORKLOAD, ModelConfig
from executor.compute.one_process.reference import Summary, compare, train_reference
from executor.data.prepare import stdlib_dir
from executor.data.token_file import microbatch_from, open_tokens, with_data
from recycle.cli import app

SMALL = ["--vocab", "256", "--seq-len", "8", "--d-model", "16", "--layers", "2",
         "--micro-batch-size", "2"]


def one_line_exit_2(r, says):
    err = r.stderr if getattr(r, "stderr", None) else r.output
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and says in lines[0], err


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Token file of the standard library's json package: real text on every machine."""
    out = tmp_path_factory.mktemp("data") / "json.bin"
    r = CliRunner().invoke(app, ["data", "prepare", os.path.join(stdlib_dir(), "json"),
                                 "--out", str(out)])
    assert r.exit_code == 0, r.output
    return out


def test_prepare_writes_the_files_bytes_with_separators(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("héllo\n")
    b.write_text("world")
    (tmp_path / "bin.dat").write_bytes(b"\xff\xfe\x00")
    out = tmp_path / "t.bin"
    r = CliRunner().invoke(app, ["data", "prepare", str(a), str(tmp_path), "--glob", "*.dat",
                                 str(b), "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "1 skipped" in r.output
    tf = open_tokens(str(out))
    assert (tf.vocab, tf.width) == (256, 1)
    want = "héllo\n".encode() + b"\0" + b"world\0"
    assert bytes(tf.data.tolist()) == want and tf.tokens == len(want)
    # the stored file is never replaced by accident
    r = CliRunner().invoke(app, ["data", "prepare", str(a), "--out", str(out)])
    one_line_exit_2(r, "exists; pass --force")
    assert open_tokens(str(out)).tokens == len(want)


@pytest.mark.parametrize("args,says", [
    (["/no/such/file.txt"], "/no/such/file.txt: no such file or directory"),
    (["{tmp}", "--glob", "*.none"], "no file matching '*.none'"),
    (["{tmp}/empty.txt"], "the files hold no text"),
    (["{tmp}/empty.txt", "--out", "{tmp}"], "is a directory"),
])
def test_prepare_bad_input_is_one_line(tmp_path, args, says):
    (tmp_path / "empty.txt").write_text("")
    args = [a.format(tmp=tmp_path) for a in args]
    if "--out" not in args:
        args += ["--out", str(tmp_path / "o.bin")]
    one_line_exit_2(CliRunner().invoke(app, ["data", "prepare", *args]), says)


def test_microbatches_depend_only_on_iteration_and_g(corpus):
    tf = open_tokens(str(corpus))
    x, y = microbatch_from(tf, 0, 4, 16, 3, 5)
    assert x.shape == y.shape == (4, 16) and x.dtype == torch.long
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the next tokens
    again = microbatch_from(open_tokens(str(corpus)), 0, 4, 16, 3, 5)
    assert torch.equal(x, again[0]) and torch.equal(y, again[1])
    assert not torch.equal(x, microbatch_from(tf, 0, 4, 16, 3, 6)[0])
    text = bytes(x[0].tolist()).decode("utf-8", errors="replace")
    assert any(w in text for w in ("json", "def", "self", " ", "\n"))


@pytest.mark.hard_timeout(120)
def test_train_on_real_text_killed_is_exact_and_learns(tmp_path, corpus):
    out = tmp_path / "summary.json"
    r = CliRunner().invoke(app, ["train", "--data", str(corpus), *SMALL, "--lr", "1e-2",
                                 "-d", "2", "-s", "2", "-m", "2", "--iterations", "6",
                                 "--kill", "1:0@2", "--timeout", "4",
                                 "--run-dir", str(tmp_path), "--summary", str(out)])
    assert r.exit_code == 0, r.output
    got = Summary.load(str(out))
    cfg = ModelConfig(vocab=256, seq_len=8, d_model=16, n_layers=2, micro_batch_size=2)
    training = TrainingSettings(lr=1e-2, total_iters=6, data=str(corpus))
    ref = train_reference(cfg, 2, 2, 6, 2, training=training,
                          workload=with_data(DEFAULT_WORKLOAD, training.data))
    assert not compare(got, ref, 1e-5), r.output
    assert got.losses[-1] < got.losses[0] - 0.5, got.losses  # it learns the text
    synthetic = train_reference(cfg, 2, 2, 6, 2,
                                training=dataclasses.replace(training, data=""))
    assert compare(got, synthetic)  # and it was the text it learned, not the Markov data


@pytest.mark.parametrize("extra,says", [
    (["--vocab", "64"], "more than the model's vocab of 64"),
    (["--seq-len", "100000"], "too few for one global batch"),
    (["--model", "examples.mlp_workload:workload"], "does not declare reads_tokens=True"),
])
def test_train_data_bad_input_is_one_line(corpus, extra, says):
    args = ["train", "--data", str(corpus), *SMALL, "--iterations", "1", *extra]
    one_line_exit_2(CliRunner().invoke(app, args), says)


def test_train_data_that_is_not_a_token_file(tmp_path):
    bad = tmp_path / "x.txt"
    bad.write_text("plain text, not prepared")
    one_line_exit_2(CliRunner().invoke(app, ["train", "--data", str(bad), *SMALL]),
                    "is not a token file")
    one_line_exit_2(CliRunner().invoke(app, ["train", "--data", str(tmp_path / "nope"), *SMALL]),
                    "no such file")
