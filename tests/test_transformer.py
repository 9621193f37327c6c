"""The Transformer's defining properties, checked on a randomly initialised model."""

import math

import numpy as np
import pytest
import torch

from model.batching import pad
from model.decoding import TorchDecoder
from model.transformer import (Transformer, causal_mask, padding_mask, preset,
                               sinusoidal_positional_encoding)

torch.manual_seed(0)


def make(arch="encoder-decoder", **kw):
    m = Transformer(preset("tiny", vocab_size=97, arch=arch, **kw))
    return m.eval()


def test_positional_encoding_is_the_papers_formula():
    d_model, L = 16, 50
    pe = sinusoidal_positional_encoding(L, d_model)
    for pos in (0, 1, 7, 49):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            assert pe[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert pe[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_masks_have_the_documented_shapes_and_values():
    ids = torch.tensor([[5, 6, 0], [7, 0, 0]])
    m = padding_mask(ids, 0)
    assert m.shape == (2, 1, 1, 3) and m[0, 0, 0].tolist() == [True, True, False]
    c = causal_mask(3)
    assert c.shape == (1, 1, 3, 3)
    assert c[0, 0].tolist() == [[True, False, False], [True, True, False], [True, True, True]]


def test_sentence_alone_equals_sentence_padded_in_a_batch():
    model = make()
    short = [11, 12, 13, 3]
    longer = [20, 21, 22, 23, 24, 25, 26, 27, 3]
    tgt_short = [2, 30, 31]
    tgt_long = [2, 40, 41, 42, 43, 44, 45]
    with torch.no_grad():
        src1 = pad([short])
        mem1 = model.encode(src1, padding_mask(src1, 0))
        t1 = pad([tgt_short])
        out1 = model(src1, t1, padding_mask(src1, 0), padding_mask(t1, 0) & causal_mask(t1.size(1)))
        srcB = pad([longer, short])
        memB = model.encode(srcB, padding_mask(srcB, 0))
        tB = pad([tgt_long, tgt_short])
        outB = model(srcB, tB, padding_mask(srcB, 0), padding_mask(tB, 0) & causal_mask(tB.size(1)))
    assert torch.allclose(mem1[0], memB[1, : len(short)], atol=1e-5)
    lp1 = torch.log_softmax(out1[0], -1)
    lpB = torch.log_softmax(outB[1, : len(tgt_short)], -1)
    assert torch.allclose(lp1, lpB, atol=1e-5)


@pytest.mark.parametrize("arch", ["encoder-decoder", "decoder"])
def test_changing_a_future_token_never_changes_earlier_positions(arch):
    model = make(arch)
    src = pad([[11, 12, 13, 14, 3]]) if arch == "encoder-decoder" else None
    src_mask = padding_mask(src, 0) if src is not None else None
    tgt = torch.tensor([[2, 30, 31, 32, 33, 34]])
    mask = causal_mask(tgt.size(1))
    with torch.no_grad():
        a = model(src, tgt, src_mask, mask)
        for j in range(1, tgt.size(1)):
            changed = tgt.clone()
            changed[0, j:] = 50
            b = model(src, changed, src_mask, mask)
            assert torch.allclose(a[0, :j], b[0, :j], atol=1e-6)
            assert not torch.allclose(a[0, j:], b[0, j:], atol=1e-3)


@pytest.mark.parametrize("arch", ["encoder-decoder", "decoder"])
def test_incremental_decoding_with_cache_equals_full_decoding(arch):
    model = make(arch)
    src = pad([[11, 12, 13, 14, 3], [15, 16, 3]]) if arch == "encoder-decoder" else None
    src_mask = padding_mask(src, 0) if src is not None else None
    tgt = torch.tensor([[2, 30, 31, 32, 33], [2, 40, 41, 42, 43]])
    with torch.no_grad():
        full = torch.log_softmax(model(src, tgt, src_mask, causal_mask(tgt.size(1))), -1)
        dec = TorchDecoder(model, src)
        for t in range(tgt.size(1)):
            step = dec.step(tgt[:, t].numpy())
            np.testing.assert_allclose(step, full[:, t].numpy(), atol=1e-5)


def test_decoder_only_has_no_encoder_and_no_cross_attention():
    model = make("decoder")
    assert model.encoder is None
    assert all(layer.cross_attn is None for layer in model.decoder)


def test_embeddings_are_tied():
    model = make()
    logits = model.generator(torch.eye(model.config.d_model)[None])
    assert torch.allclose(logits[0], model.embed.weight.t(), atol=1e-6)


def test_config_rejects_bad_values_with_a_valid_example():
    with pytest.raises(ValueError, match="divisible"):
        preset("tiny", d_model=65)
    with pytest.raises(ValueError, match="unknown preset"):
        preset("huge")


def _brute_force_best(model, src, length, vocab):
    """Highest-scoring complete sequence of exactly `length` tokens + eos, by enumeration."""
    import itertools
    best = (-math.inf, None)
    with torch.no_grad():
        mem_mask = padding_mask(src, 0)
        for seq in itertools.product(vocab, repeat=length):
            tgt = torch.tensor([[2, *seq]])
            lp = torch.log_softmax(model(src, tgt, mem_mask, causal_mask(tgt.size(1))), -1)[0]
            s = sum(lp[i, tok].item() for i, tok in enumerate(seq)) + lp[length, 3].item()
            best = max(best, (s, list(seq)))
    return best


def test_fairseq_init_draws_qkv_as_one_matrix_and_zeroes_the_biases():
    from model.transformer import MultiHeadAttention, fairseq_init

    torch.manual_seed(0)
    model = Transformer(preset("small", vocab_size=300))
    fairseq_init(model)
    d = model.config.d_model
    for module in model.modules():
        if isinstance(module, MultiHeadAttention):
            for projection in (module.w_q, module.w_k, module.w_v):
                bound = (6 / (4 * d)) ** 0.5                     # xavier over (3d, d)
                assert projection.weight.abs().max() <= bound and projection.weight.abs().max() > 0.9 * bound
            assert module.w_o.weight.abs().max() > 0.9 * (6 / (2 * d)) ** 0.5   # w_o keeps its own
        if isinstance(module, torch.nn.Linear) and module.bias is not None:
            assert not module.bias.any()
