"""The pieces of the built-in models' training: corpus selection and hashing, prompts, the training
loop (on a toy corpus; the real training never runs in tests) and the acceptance measure."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch

from specsim.models import corpus
from specsim.models.config import ModelConfig
from specsim.models.evaluate import acceptance, evaluate_family
from specsim.models.train import FAMILY, TrainSettings, _batches, _lr_at, train_model


@pytest.fixture()
def fake_stdlib(tmp_path):
    root = tmp_path / "lib"
    root.mkdir()
    for i in range(23):
        body = "".join(f"def f{i}_{j}(x):\n    return x + {j}\n\n" for j in range(30))
        (root / f"m{i:02d}.py").write_text(f'"""Module {i}."""\n' + body)
    (root / "notes.txt").write_text("not python")
    (root / "pkg").mkdir()
    (root / "pkg" / "inner.py").write_text("x = 1\n")
    return root


def test_corpus_is_the_sorted_top_level_python_files(fake_stdlib):
    files = corpus.corpus_files(fake_stdlib)
    assert [f.name for f in files] == [f"m{i:02d}.py" for i in range(23)]
    train, held = corpus.split_files(files)
    assert [f.name for f in held] == ["m05.py", "m15.py"]
    assert len(train) == 21 and not set(train) & set(held)


def test_corpus_digest_notices_any_change(fake_stdlib):
    files = corpus.corpus_files(fake_stdlib)
    before = corpus.corpus_sha256(files)
    assert corpus.corpus_sha256(files) == before
    files[3].write_text(files[3].read_text() + "#")
    assert corpus.corpus_sha256(files) != before
    assert corpus.corpus_sha256(files[:-1]) != corpus.corpus_sha256(files)


def test_token_stream_wraps_each_file_in_bos_and_eos(fake_stdlib):
    files = corpus.corpus_files(fake_stdlib)[:2]
    stream = corpus.token_stream(files)
    first = files[0].read_bytes()
    assert stream[0] == 256 and stream[len(first) + 1] == 257 and stream[len(first) + 2] == 256
    assert bytes(stream[1 : len(first) + 1].astype(np.uint8)) == first
    assert len(stream) == sum(len(f.read_bytes()) + 2 for f in files)


def test_prompts_are_whole_lines_of_the_requested_size_and_reproducible(fake_stdlib):
    files = corpus.corpus_files(fake_stdlib)[:3]
    prompts = corpus.make_prompts(files, 12, np.random.default_rng(7), 60, 120)
    again = corpus.make_prompts(files, 12, np.random.default_rng(7), 60, 120)
    assert prompts == again and len(set(prompts)) == 12
    sources = "".join(f.read_text() for f in files)
    for prompt in prompts:
        assert 60 <= len(prompt.encode()) <= 120
        assert prompt.endswith("\n") and prompt in sources
    lines = corpus.prompts_jsonl(prompts).splitlines()
    assert [json.loads(line)["prompt"] for line in lines] == prompts


def test_learning_rate_warms_up_then_decays_to_the_floor():
    s = TrainSettings(steps=100, warmup_steps=10, lr=1.0, min_lr_fraction=0.1)
    rates = [_lr_at(i, s) for i in range(100)]
    assert rates[0] == pytest.approx(0.1) and rates[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in itertools.pairwise(rates[9:]))
    assert rates[-1] == pytest.approx(0.1, abs=0.01)


def test_every_model_sees_the_same_batches():
    stream = torch.arange(1000)
    s = TrainSettings(steps=3, batch_size=4, context=16)
    first, second = list(_batches(stream, s)), list(_batches(stream, s))
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    assert first[0].shape == (4, 17)
    assert torch.equal(first[0][:, 1:] - first[0][:, :-1], torch.ones(4, 16, dtype=torch.long))


@pytest.mark.slow
def test_training_learns_a_repetitive_text():
    """A one-layer model, 60 steps on a periodic text: the loss falls far below uniform
    (log 258 = 5.55 nats), which an optimiser or gradient bug would prevent."""
    config = FAMILY["specsim-draft-tiny"]
    text = ("def add(a, b):\n    return a + b\n\n" * 200).encode()
    stream = torch.tensor(list(text), dtype=torch.long)
    settings = TrainSettings(steps=60, batch_size=8, context=64, warmup_steps=5, bf16=False)
    model = train_model(config, stream, settings, log=lambda line: None)
    report = evaluate_family({"tiny": model}, stream, 64, 8)
    assert report["loss_nats_per_byte"]["tiny"] < 1.0
    assert not model.training


def test_acceptance_is_one_minus_total_variation():
    p = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]]).log()
    q = torch.tensor([[0.9, 0.1, 0.0], [0.2, 0.3, 0.5]]).log()
    beta = acceptance(p, q)
    torch.testing.assert_close(beta, torch.tensor([0.6, 1.0], dtype=torch.float64))
    disjoint = acceptance(torch.tensor([0.0, -1e9]), torch.tensor([-1e9, 0.0]))
    assert disjoint.item() < 1e-12
    # A higher temperature flattens both distributions towards uniform: acceptance rises.
    logits_p, logits_q = torch.tensor([3.0, 0.0, -1.0]), torch.tensor([0.0, 3.0, -1.0])
    assert acceptance(logits_p, logits_q, 2.0) > acceptance(logits_p, logits_q, 1.0)


def test_family_sizes_are_clearly_different():
    sizes = [c.param_count() for c in FAMILY.values()]
    assert sizes[0] > 10 * sizes[1] > 30 * sizes[2]
    assert all(isinstance(c, ModelConfig) and c.tokenizer == "bytes" for c in FAMILY.values())
    total_fp16 = sum(c.weight_bytes(2) for c in FAMILY.values())
    assert total_fp16 < 10 * 1024 * 1024


def test_evaluation_windows_spread_over_the_whole_stream():
    from specsim.models.evaluate import windows

    stream = torch.arange(1001)
    picked = windows(stream, 10, 5)
    assert picked.shape == (5, 11)
    assert picked[:, 0].tolist() == [0, 250, 500, 740, 990]  # evenly from first to last window
    assert torch.equal(picked[1], torch.arange(250, 261))
    assert windows(stream, 10, 1000).shape[0] == 100  # never more than the stream holds
