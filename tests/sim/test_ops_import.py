"""`capsim profile import-ops` on tiny hand-made aiconfigurator CSVs: the reduced tables, and FP8 GEMM rows of
GPUs the snapshot leaves out (`--gemm-fp8-more`, benchmarks/aiconfigurator_gemm_fp8.py's output)."""

from __future__ import annotations

import gzip

import pytest

from capsim.ops_import import import_ops
from sim.io.errors import ConfigError


def _src(tmp_path):
    src = tmp_path / "aic"
    src.mkdir(parents=True)
    gemm = ["gpu,m,n,k,latency_ms"] + [f"{g},{m},512,512,{0.01 * m:.3f}" for g in ("h100_sxm", "b200_sxm")
                                        for m in (1, 8, 64)]
    (src / "gemm_bf16.csv").write_text("\n".join(gemm) + "\n")
    (src / "gemm_fp8.csv").write_text("gpu,m,n,k,latency_ms\n" + "".join(f"h100_sxm,{m},512,512,{0.005 * m:.4f}\n"
                                                                        for m in (1, 8, 64)))
    att = "gpu,kernel_source,batch_size,{len},num_heads,num_key_value_heads,head_dim,latency_ms\n"
    rows = "".join(f"{g},k,1,{n},8,8,128,{0.001 * n:.3f}\n" for g in ("h100_sxm", "b200_sxm") for n in (16, 64))
    (src / "context_attention_bf16.csv").write_text(att.format(len="seq_len") + rows.replace(",k,", ",vllm_flashinfer_trtllmprefill,"))
    (src / "generation_attention_bf16.csv").write_text(att.format(len="kv_len") + rows)
    (src / "nccl.csv").write_text("gpu,op_name,nccl_dtype,num_gpus,message_size_elements,message_size_bytes,latency_ms\n"
                                  + "".join(f"{g},all_reduce,half,2,1024,2048,0.01\n" for g in ("h100_sxm", "b200_sxm")))
    return src


def _lines(path):
    return gzip.decompress(path.read_bytes()).decode().splitlines()


def test_fp8_gemms_of_more_gpus_join_the_snapshot_and_their_source_says_where_from(tmp_path):
    src, out = _src(tmp_path), tmp_path / "ops"
    written = import_ops(src, out, ["h100-sxm", "b200"], progress=lambda _: None)
    assert "gemm_fp8.csv.gz" in written["h100-sxm"] and "gemm_fp8.csv.gz" not in written["b200"]
    assert not (out / "b200" / "gemm_fp8.csv.gz").exists()
    h100_before = (out / "h100-sxm" / "gemm_fp8.csv.gz").read_bytes()

    more = tmp_path / "more.csv"
    more.write_text("gpu,m,n,k,latency_ms\n" + "".join(f"b200_sxm,{m},512,512,{0.002 * m:.4f}\n" for m in (1, 8, 64)))
    written = import_ops(src, out, ["h100-sxm", "b200"], progress=lambda _: None, gemm_fp8_more=more)
    assert written["b200"]["gemm_fp8.csv.gz"] == 3
    assert _lines(out / "b200" / "gemm_fp8.csv.gz") == ["m,n,k,latency_us", "1,512,512,2", "8,512,512,16",
                                                         "64,512,512,128"]
    assert (out / "h100-sxm" / "gemm_fp8.csv.gz").read_bytes() == h100_before   # the snapshot's rows unchanged
    assert "aiconfigurator 0.12.0 wheel" in (out / "b200" / "source.txt").read_text()
    assert "wheel" not in (out / "h100-sxm" / "source.txt").read_text()


@pytest.mark.parametrize("text, words", [
    ("gpu,m,n,k,latency\nb200_sxm,1,512,512,0.1\n", "expected the columns gpu,m,n,k,latency_ms"),
    ("gpu,m,n,k,latency_ms\nh100_sxm,1,512,512,0.1\n", "h100_sxm, which the snapshot's gemm_fp8.csv already has"),
])
def test_bad_extra_rows_are_refused_naming_the_file(tmp_path, text, words):
    more = tmp_path / "more.csv"
    more.write_text(text)
    with pytest.raises(ConfigError, match=words) as e:
        import_ops(_src(tmp_path), tmp_path / "ops", ["b200"], progress=lambda _: None, gemm_fp8_more=more)
    assert str(more) in str(e.value)
    with pytest.raises(ConfigError, match="not found"):
        import_ops(_src(tmp_path / "x"), tmp_path / "ops", ["b200"], progress=lambda _: None,
                   gemm_fp8_more=tmp_path / "none.csv")


def _more_folder(tmp_path, gpu="b300_sxm"):
    """The five tables for a GPU the snapshot lacks, as benchmarks/aiconfigurator_cards.py writes them."""
    more = tmp_path / "more"
    more.mkdir(parents=True)
    (more / "gemm_bf16.csv").write_text("gpu,m,n,k,latency_ms\n" + "".join(f"{gpu},{m},512,512,{0.004 * m:.4f}\n"
                                                                       for m in (1, 8)))
    (more / "gemm_fp8.csv").write_text("gpu,m,n,k,latency_ms\n" + f"{gpu},1,512,512,0.002\n")
    att = "gpu,kernel_source,batch_size,{len},num_heads,num_key_value_heads,head_dim,latency_ms\n"
    # the prefill table also times the decode kernel on prompts: only the prefill kernel's rows are kept
    (more / "context_attention_bf16.csv").write_text(
        att.format(len="seq_len") + f"{gpu},vllm_flashinfer_trtllmprefill,1,16,8,8,128,0.010\n"
        f"{gpu},vllm_flashinfer_trtllmdecode,1,16,8,8,128,0.999\n")
    (more / "generation_attention_bf16.csv").write_text(att.format(len="kv_len") + f"{gpu},k,1,16,8,8,128,0.002\n")
    (more / "nccl.csv").write_text("gpu,op_name,nccl_dtype,num_gpus,message_size_elements,message_size_bytes,"
                                   f"latency_ms\n{gpu},all_reduce,half,2,1024,2048,0.008\n")
    return more


def test_a_card_the_snapshot_lacks_is_written_from_the_more_folder(tmp_path):
    src, out = _src(tmp_path), tmp_path / "ops"
    written = import_ops(src, out, None, progress=lambda _: None)
    assert "b300" not in written and not (out / "b300").exists()   # no rows, no folder
    written = import_ops(src, out, None, progress=lambda _: None, more=_more_folder(tmp_path))
    assert written["b300"] == {"gemm_bf16.csv.gz": 2, "gemm_fp8.csv.gz": 1, "context_attention.csv.gz": 1,
                               "generation_attention.csv.gz": 1, "nccl.csv": 1}
    assert _lines(out / "b300" / "context_attention.csv.gz") == [
        "batch,seq_len,heads,kv_heads,head_dim,latency_us", "1,16,8,8,128,10"]
    source = (out / "b300" / "source.txt").read_text()
    assert source.startswith("NVIDIA B300") and "benchmarks/aiconfigurator_cards.py" in source
    assert "aiconfigurator_cards" not in (out / "h100-sxm" / "source.txt").read_text()


def test_a_more_folder_that_repeats_a_snapshot_card_or_misses_a_table_is_refused(tmp_path):
    src = _src(tmp_path)
    with pytest.raises(ConfigError, match="b200_sxm, which the snapshot's gemm_bf16.csv already has"):
        import_ops(src, tmp_path / "ops", None, progress=lambda _: None, more=_more_folder(tmp_path, "b200_sxm"))
    more = _more_folder(tmp_path / "x")
    (more / "nccl.csv").unlink()
    with pytest.raises(ConfigError, match="nccl.csv: not found"):
        import_ops(src, tmp_path / "ops", None, progress=lambda _: None, more=more)


def test_a_missing_or_file_source_is_named_as_a_folder(tmp_path):
    with pytest.raises(ConfigError) as e:
        import_ops(tmp_path / "nowhere", tmp_path / "ops", ["b200"], progress=lambda _: None)
    assert str(e.value).startswith(f"{tmp_path / 'nowhere'}: no such folder")
    (tmp_path / "f.csv").write_text("x\n")
    with pytest.raises(ConfigError, match="f.csv: is not a folder"):
        import_ops(tmp_path / "f.csv", tmp_path / "ops", ["b200"], progress=lambda _: None)
