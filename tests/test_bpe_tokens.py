"""`recycle data prepare --tokenizer bpe:VOCAB | tokenizer.json`: real token ids (Hugging
Face `tokenizers`) in nanoGPT's layout, the model's vocab from the sidecar, exact under a
SIGKILL."""
import json
import os

import numpy as np
import pytest
from typer.testing import CliRunner

from executor.compute.config import ModelConfig, TrainingSettings
from executor.compute.one_process.reference import Summary, compare, train_reference
from executor.data.prepare import stdlib_dir
from executor.data.token_file import open_tokens, with_data
from executor.models.families import FAMILIES, architecture
from recycle.cli import app
from test_token_data import one_line_exit_2

# real text on every machine with Python: the json package's sources and the licence
TEXT = [os.path.join(stdlib_dir(), "json"), os.path.join(stdlib_dir(), "LICENSE.txt")]
TEXT = [p for p in TEXT if os.path.exists(p)]


def prepare(*args):
    return CliRunner().invoke(app, ["data", "prepare", *args])


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    pytest.importorskip("tokenizers")
    out = tmp_path_factory.mktemp("bpe") / "text.bin"
    r = prepare(*TEXT, "--tokenizer", "bpe:512", "--out", str(out))
    assert r.exit_code == 0, r.output
    assert "uint16, vocab 512, bpe:512" in r.output, r.output
    return out


def documents():
    """What `prepare` reads from TEXT, in its order."""
    from executor.data.prepare import read_documents
    return [d.decode() for d in read_documents(TEXT, "*.py", 0)[0]]


def test_bpe_file_is_nanogpt_layout_and_decodes_to_the_text(bpe):
    from executor.data.tokenizer import tokenizer_of
    meta = json.loads(open(f"{bpe}.json").read())
    assert (meta["dtype"], meta["vocab"], meta["end_of_text"]) == ("uint16", 512, 0)
    assert meta["tokenizer"] == "text.bin.tokenizer.json"
    ids = np.memmap(bpe, dtype=meta["dtype"], mode="r")  # as a nanoGPT script reads it
    assert ids.size == meta["tokens"] == open_tokens(str(bpe)).tokens
    text_bytes = sum(len(d.encode()) for d in documents())
    assert ids.max() < 512 and ids.size < text_bytes / 2  # merges: fewer ids than bytes
    # documents end with <|endoftext|> (id 0) and decode back to their text exactly
    tok = tokenizer_of(str(bpe))
    ends = np.flatnonzero(ids == 0)
    starts = np.concatenate([[0], ends[:-1] + 1])
    got = [tok.decode(ids[a:b].tolist()) for a, b in zip(starts, ends)]
    assert got == documents()


def test_a_given_tokenizer_json_is_used_as_is(bpe, tmp_path):
    import tokenizers
    given = tmp_path / "tok.json"
    given.write_bytes(open(f"{bpe}.tokenizer.json", "rb").read())
    out = tmp_path / "again.bin"
    r = prepare(*TEXT, "--tokenizer", str(given), "--out", str(out))
    assert r.exit_code == 0, r.output
    assert np.array_equal(np.fromfile(out, dtype=np.uint16), np.fromfile(bpe, dtype=np.uint16))
    # a vocabulary past 16 bits: uint32 ids, as the sidecar says
    words = {"[UNK]": 0, "<|endoftext|>": 1, **{f"w{i}": i + 2 for i in range(70_000)}}
    big = tokenizers.Tokenizer(tokenizers.models.WordLevel(words, unk_token="[UNK]"))
    big.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    big.save(str(tmp_path / "big.json"))
    (tmp_path / "w.txt").write_text("w1 w69999 w5\nw70001 w3")
    r = prepare(str(tmp_path / "w.txt"), "--tokenizer", str(tmp_path / "big.json"),
                "--out", str(tmp_path / "w.bin"))
    assert r.exit_code == 0, r.output
    tf = open_tokens(str(tmp_path / "w.bin"))
    assert (tf.dtype, tf.vocab) == ("uint32", 70_002)
    assert tf.data.tolist() == [3, 70001, 7, 0, 5, 1]  # w70001 is unknown: [UNK]


@pytest.mark.parametrize("spec,says", [
    ("sentencepiece:1000", "unknown tokenizer (use bpe:VOCAB"),
    ("bpe", "unknown tokenizer"),
    ("bpe:lots", "VOCAB must be a whole number"),
    ("bpe:100", "vocab too small; byte-level BPE needs at least 257"),
    ("bpe:99999999", "vocab too large"),
    ("/no/such/tokenizer.json", "/no/such/tokenizer.json: no such file"),
    ("{tmp}/not_a_tokenizer.json", "is not a `tokenizers` JSON file"),
])
def test_bad_tokenizer_is_one_line(tmp_path, spec, says):
    if "not_a" in spec:
        pytest.importorskip("tokenizers")
    (tmp_path / "not_a_tokenizer.json").write_text('{"hello": 1}')
    out = tmp_path / "o.bin"
    one_line_exit_2(prepare(*TEXT, "--tokenizer", spec.format(tmp=tmp_path), "--out",
                            str(out)), says)
    assert not out.exists() and not os.path.exists(f"{out}.json")


def test_corrupt_sidecar_is_one_line(bpe, tmp_path):
    copy = tmp_path / "c.bin"
    copy.write_bytes(bpe.read_bytes()[:-2])  # one token short of what the sidecar says
    (tmp_path / "c.bin.json").write_text(open(f"{bpe}.json").read())
    args = ["train", "--data", str(copy), "--model", "llama:debug", "--iterations", "1"]
    one_line_exit_2(CliRunner().invoke(app, args), "not the")
    (tmp_path / "c.bin.json").write_text("{}")
    one_line_exit_2(CliRunner().invoke(app, args), "is not a recycle.tokens/v1 file")


def test_vocab_comes_from_the_sidecar(bpe):
    # a smaller --vocab cannot hold the ids (left out, the file's 512 is used: the
    # training test below; llama:debug's own 256 gives way to it)
    one_line_exit_2(CliRunner().invoke(app, ["train", "--data", str(bpe), "--vocab", "300"]),
                    "more than the model's vocab of 300")
    assert architecture("llama:debug")["vocab"] == 256 != open_tokens(str(bpe)).vocab


@pytest.mark.hard_timeout(180)
def test_llama_trains_on_bpe_tokens_killed_exact(bpe, tmp_path):
    """llama:debug (vocab 256 of its own) trains on the 512-id BPE file: the embedding and
    head take the sidecar's vocab, a SIGKILL changes nothing, and it learns."""
    out = tmp_path / "summary.json"
    r = CliRunner().invoke(app, ["train", "--model", "llama:debug", "--data", str(bpe),
                                 "-d", "2", "-s", "2", "-m", "2", "--iterations", "6",
                                 "--micro-batch-size", "2", "--seq-len", "16", "--lr", "1e-2",
                                 "--kill", "1:1@2", "--timeout", "4",
                                 "--run-dir", str(tmp_path), "--summary", str(out)])
    assert r.exit_code == 0, r.output
    got = Summary.load(str(out))
    shape = {**architecture("llama:debug", seq_len=16), "vocab": 512}
    cfg = ModelConfig(micro_batch_size=2, **shape)
    training = TrainingSettings(lr=1e-2, total_iters=6, data=str(bpe))
    wl = with_data(FAMILIES["llama"].workload(), training.data)
    ref = train_reference(cfg, 2, 2, 6, 2, training=training, workload=wl)
    assert not compare(got, ref, 1e-5), r.output
    assert abs(got.losses[0] - np.log(512)) < 0.5, got.losses  # a 512-way softmax at first
    assert min(got.losses[3:]) < got.losses[0] - 0.5, got.losses  # it learns (seeded: the same every run)
