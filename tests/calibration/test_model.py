"""The reference model: its KV cache gives the same hidden states whether a sequence is computed whole,
in chunks after a cached prefix, or decoded in a batch with sequences of other lengths."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the reference model needs torch")

from calibration.model import ReferenceModel  # noqa: E402
from calibration.shapes import Shape, tiny_model_profile  # noqa: E402


def _copy_prefix(dst_cache, dst_group, dst_seq, src_cache, src_group, src_seq, tokens):
    for d_layer, s_layer in zip(dst_cache.layers, src_cache.layers):
        for i in (0, 1):
            d_layer[dst_group][i][dst_seq, :, :tokens] = s_layer[src_group][i][src_seq, :, :tokens]


@pytest.mark.parametrize("family", ["qwen3", "qwen2", "llama"])
def test_chunked_prefill_and_mixed_decode_match_whole_prompt(family):
    prof = tiny_model_profile(family=family, tie_word_embeddings=family != "llama")
    m = ReferenceModel(prof, "fp32", "cpu", seed=1)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, prof.vocab_size, (24,), generator=g)
    with torch.inference_mode():
        whole = Shape.parse("1x24@0")
        bw, cw = m.prepare(whole), m.new_cache(whole)
        ref = m.run_layers(m.embed_tokens(ids), bw, cw)

        # the last 8 tokens as a chunk after 16 cached tokens
        chunk = Shape.parse("1x8@16")
        bc, cc = m.prepare(chunk), m.new_cache(chunk)
        _copy_prefix(cc, 0, 0, cw, 0, 0, 16)
        out = m.run_layers(m.embed_tokens(ids[16:]), bc, cc)
        torch.testing.assert_close(out, ref[16:], rtol=1e-5, atol=1e-5)

        # token 23 decoded after 23 cached tokens, batched with 2 sequences of another length (context 5)
        mixed = Shape.parse("2x1@5+1x1@23")
        bm, cm = m.prepare(mixed), m.new_cache(mixed)
        _copy_prefix(cm, 1, 0, cw, 0, 0, 23)
        dec_ids = torch.cat([ids[:2], ids[23:24]])
        out = m.run_layers(m.embed_tokens(dec_ids), bm, cm)
        torch.testing.assert_close(out[2], ref[23], rtol=1e-5, atol=1e-5)


def test_subset_of_layers_and_tied_head():
    prof = tiny_model_profile(num_layers=4)
    m = ReferenceModel(prof, "bf16", "cpu", num_layers=2)
    assert len(m.layers) == 2 and m.lm_head is m.embed
    s = Shape.parse("prefill:2x8@4")
    b = m.prepare(s)
    with torch.inference_mode():
        out = m(m.token_ids(b, torch.Generator().manual_seed(0)), b, m.new_cache(s))
    assert out.shape == (2,)
    with pytest.raises(ValueError, match="layers: 5 not in 1..4"):
        ReferenceModel(prof, "fp32", "cpu", num_layers=5)


def test_moe_is_refused():
    from sim.io.profiles import load_model
    with pytest.raises(ValueError, match="MoE and MLA are not implemented"):
        ReferenceModel(load_model("mixtral-8x7b"), "bf16", "meta")


def test_the_no_cudnn_context_leaves_cudnn_out_and_the_others_in():
    from calibration.model import no_cudnn_kernels
    b = torch.backends.cuda
    before = (b.cudnn_sdp_enabled(), b.flash_sdp_enabled(), b.mem_efficient_sdp_enabled(), b.math_sdp_enabled())
    with no_cudnn_kernels():
        assert not b.cudnn_sdp_enabled()
        assert b.flash_sdp_enabled() and b.mem_efficient_sdp_enabled() and b.math_sdp_enabled()
    assert (b.cudnn_sdp_enabled(), b.flash_sdp_enabled(), b.mem_efficient_sdp_enabled(), b.math_sdp_enabled()) == before
    # on a CPU model the policy changes nothing (cuDNN attention is CUDA's)
    model = ReferenceModel(tiny_model_profile(), "fp32", "cpu", attention="no-cudnn")
    with model.attention_backends():
        assert b.cudnn_sdp_enabled() == before[0]
    with pytest.raises(ValueError, match="attention 'flash': expected one of torch, no-cudnn"):
        ReferenceModel(tiny_model_profile(), "fp32", "cpu", attention="flash")
