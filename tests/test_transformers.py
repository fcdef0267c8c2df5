"""Transformer blocks: the cheap dropout keeps F.dropout's statistics, attention with dropout
reduces to SDPA when nothing is dropped, and a train-mode step is reproducible from the seed."""

import pytest
import torch
import torch.nn.functional as F

from simdist_planner.model.transformers import Attention, Dropout, dropout


@pytest.mark.parametrize("p", [0.05, 0.2, 0.5])
def test_dropout_keep_rate_and_expectation(p):
    torch.manual_seed(0)
    x = torch.ones(400_000)
    y = dropout(x, p, training=True)
    kept = y != 0
    assert abs(kept.float().mean().item() - (1 - p)) < 0.005
    # inverted dropout: kept values are scaled so the mean is unchanged
    assert abs(y.mean().item() - 1.0) < 0.01
    assert torch.allclose(y[kept], torch.full_like(y[kept], y[kept][0].item()))
    assert abs(y[kept][0].item() - 1 / (1 - p)) < 1e-3


def test_dropout_masks_are_independent_across_elements_and_calls():
    torch.manual_seed(1)
    x = torch.ones(64, 1000)
    a, b = dropout(x, 0.5, True) != 0, dropout(x, 0.5, True) != 0
    assert 0.45 < (a == b).float().mean().item() < 0.55  # two calls: unrelated masks
    # neighbouring elements (16-bit slices of one random word) are uncorrelated
    flat = a.flatten().float()
    corr = torch.corrcoef(torch.stack([flat[:-1], flat[1:]]))[0, 1].item()
    assert abs(corr) < 0.02


def test_dropout_is_identity_in_eval_and_at_zero_and_seeded_in_training():
    x = torch.randn(8, 16)
    assert dropout(x, 0.3, training=False) is x
    assert dropout(x, 0.0, training=True) is x
    torch.manual_seed(5)
    first = dropout(x, 0.3, True)
    torch.manual_seed(5)
    assert torch.equal(first, dropout(x, 0.3, True))
    with pytest.raises(ValueError, match="dropout probability"):
        dropout(x, 1.0, True)
    module = Dropout(0.3)
    assert torch.equal(module.eval()(x), x)
    assert "p=0.3" in repr(module)


@pytest.mark.parametrize("causal", [False, True])
def test_attention_with_dropout_is_sdpa_when_nothing_is_dropped(causal):
    torch.manual_seed(2)
    attn = Attention(16, 4, dropout=1e-9).train()  # keep probability rounds to exactly 1
    x, ctx = torch.randn(3, 5, 16), torch.randn(3, 7, 16)
    k, v = attn.keys_values(x if causal else ctx)
    q = attn._split(attn.q(x))
    ours = attn._attend_with_dropout(q, k, v, causal)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    torch.testing.assert_close(ours, ref, atol=1e-6, rtol=1e-5)


def test_attention_dropout_changes_training_outputs_only():
    torch.manual_seed(3)
    attn = Attention(16, 4, dropout=0.5)
    x = torch.randn(2, 6, 16)
    eval_out = attn.eval()(x, x, causal=True)
    torch.testing.assert_close(attn(x, x, causal=True), eval_out)  # eval: deterministic
    attn.train()
    assert not torch.allclose(attn(x, x, causal=True), eval_out)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_dropout_on_cuda_keeps_its_rate_and_training_attention_runs():
    torch.manual_seed(4)
    x = torch.ones(200_000, device="cuda")
    y = dropout(x, 0.2, training=True)
    assert y.device.type == "cuda" and abs((y != 0).float().mean().item() - 0.8) < 0.01
    attn = Attention(16, 4, dropout=0.1).cuda().train()
    out = attn(
        torch.randn(2, 5, 16, device="cuda"), torch.randn(2, 7, 16, device="cuda"), causal=False
    )
    assert out.shape == (2, 5, 16) and torch.isfinite(out).all()
