"""Reference decoder-only transformer in torch, built from a model profile, for timing only.

Llama and Qwen families: RMSNorm, RoPE, grouped-query attention, SwiGLU, Qwen2's q/k/v bias and
Qwen3's per-head q/k RMSNorm. Weights are seeded random values in the chosen dtype (step time
does not depend on trained values; nothing is downloaded). Projections are fused the way serving
engines fuse them (one q/k/v matrix, one gate/up matrix). Attention goes through
torch's scaled_dot_product_attention.

Batches are packed: the tokens of every sequence form one [tokens, hidden] matrix for the
projections; attention runs once per group of equal (new, cached) sequences against that group's
own KV cache (no padding to the longest context), which supports batched decode over different
context lengths and prefill chunks after a cached prefix.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from calibration.shapes import Shape
from sim.api import ModelProfile

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# attention kernels: torch's own choice, or (CUDA) the same without cuDNN's (see ReferenceModel.attention_backends)
ATTENTION = ("torch", "no-cudnn")
_EPS = 1e-6


def no_cudnn_kernels():
    """A context in which scaled_dot_product_attention may use flash, memory-efficient or math kernels, not cuDNN's
    (it only sets torch's backend flags: kernels captured in a CUDA graph inside it are the allowed ones)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def _rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """RMSNorm computed in float32, returned in x's dtype (what HF/vLLM do)."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + _EPS)
    return xf.to(x.dtype) * w


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE. x: [T, heads, D]; cos, sin: [T, 1, D/2]."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


@dataclass
class DecodeRows:
    """Single-token sequences of different lengths attended in one call against the KV slabs (a replay's
    decode batch): their K/V are written in place, their slab rows gathered up to the longest, and a mask
    keeps each token to its own length."""

    rows: torch.Tensor               # [B] packed token rows of the decode tokens
    slots: torch.Tensor              # [B] their slab rows
    positions: torch.Tensor          # [B] where each new K/V goes (its cached length)
    mask: torch.Tensor               # [B, 1, 1, L] bool: the positions each token attends (up to its own)
    groups: frozenset                # the indices of batch.shape.groups they stand for


@dataclass
class Batch:
    """Device tensors of one shape, prepared outside the timed region."""

    shape: Shape
    positions: torch.Tensor          # [T] absolute position of every packed token
    logit_rows: torch.Tensor         # [sequences] index of each sequence's last token
    masks: list[torch.Tensor | None] # per group: bool [new, cached+new] for chunks after a prefix
    tokens: int
    decode: DecodeRows | None = None # decode groups attended together (their per-group views unused)


class KVCache:
    """Per layer, per group: K and V of shape [count, kv_heads, cached + new, head_dim]; `slabs`, per layer,
    the K and V slabs [slots, kv_heads, capacity, head_dim] that a batch's DecodeRows index."""

    def __init__(self, layers: list[list[tuple[torch.Tensor, torch.Tensor]]], slabs: list | None = None):
        self.layers = layers
        self.slabs = slabs

    @property
    def nbytes(self) -> int:
        return sum(kv[0].numel() * kv[0].element_size() * 2 for groups in self.layers for kv in groups if kv is not None)


class ReferenceModel(torch.nn.Module):
    """`num_layers` layers (at most the profile's) of the profile's architecture, random weights."""

    def __init__(self, profile: ModelProfile, dtype: str, device: str | torch.device, num_layers: int | None = None,
                 seed: int = 0, attention: str = "torch"):
        super().__init__()
        if attention not in ATTENTION:
            raise ValueError(f"attention {attention!r}: expected one of {', '.join(ATTENTION)}")
        self.attention = attention
        if profile.moe is not None or profile.mla is not None:
            raise ValueError(f"model {profile.name}: the reference model covers dense Llama/Qwen layers; "
                             "MoE and MLA are not implemented")
        p = profile
        self.profile = p
        self.dtype = DTYPES[dtype]
        self.device = torch.device(device)
        self.num_layers = num_layers or p.num_layers
        if not 1 <= self.num_layers <= p.num_layers:
            raise ValueError(f"layers: {self.num_layers} not in 1..{p.num_layers}")
        self.H, self.Hkv, self.D = p.num_attention_heads, p.num_kv_heads, p.head_dim
        gen = torch.Generator(device=self.device).manual_seed(seed)
        kw = dict(dtype=self.dtype, device=self.device)

        def mat(out_f: int, in_f: int) -> torch.nn.Parameter:
            w = torch.empty(out_f, in_f, **kw).normal_(0.0, 1.0 / math.sqrt(in_f), generator=gen)
            return torch.nn.Parameter(w, requires_grad=False)

        def vec(n: int, value: float = 1.0) -> torch.nn.Parameter:
            return torch.nn.Parameter(torch.full((n,), value, **kw), requires_grad=False)

        h, q, kv = p.hidden_size, self.H * self.D, self.Hkv * self.D
        self.embed = torch.nn.Parameter(torch.empty(p.vocab_size, h, **kw).normal_(0.0, 1.0, generator=gen),
                                        requires_grad=False)
        self.layers = torch.nn.ModuleList()
        for _ in range(self.num_layers):
            layer = torch.nn.Module()
            layer.w_in = vec(h)
            layer.w_qkv = mat(q + 2 * kv, h)
            layer.b_qkv = vec(q + 2 * kv, 0.0) if p.qkv_bias else None
            layer.q_norm = vec(self.D) if p.qk_norm else None
            layer.k_norm = vec(self.D) if p.qk_norm else None
            layer.w_o = mat(h, q)
            layer.w_post = vec(h)
            layer.w_gate_up = mat(2 * p.intermediate_size, h)
            layer.w_down = mat(h, p.intermediate_size)
            self.layers.append(layer)
        self.norm = vec(h)
        self.lm_head = self.embed if p.tie_word_embeddings else mat(p.vocab_size, h)
        # RoPE tables for every position the profile allows (base 1e6 as Qwen; the value is irrelevant to time)
        inv = 1.0 / (1e6 ** (torch.arange(0, self.D, 2, device=self.device, dtype=torch.float32) / self.D))
        ang = torch.outer(torch.arange(p.max_position_embeddings + 1, device=self.device, dtype=torch.float32), inv)
        self.register_buffer("cos_table", ang.cos().to(self.dtype), persistent=False)
        self.register_buffer("sin_table", ang.sin().to(self.dtype), persistent=False)

    # --- bytes -------------------------------------------------------------------------------
    @property
    def param_bytes(self) -> int:
        seen, n = set(), 0
        for t in self.parameters():
            if id(t) not in seen:
                seen.add(id(t))
                n += t.numel() * t.element_size()
        return n

    # --- inputs ------------------------------------------------------------------------------
    def prepare(self, shape: Shape) -> Batch:
        """Positions, logit rows and attention masks of a batch of attention groups."""
        pos, rows, masks, off = [], [], [], 0
        for g in shape.groups:
            per_seq = torch.arange(g.cached, g.cached + g.new)
            pos.append(per_seq.repeat(g.count))
            rows.extend(off + s * g.new + g.new - 1 for s in range(g.count))
            if g.new > 1 and g.cached > 0:
                i = torch.arange(g.new).unsqueeze(1)
                j = torch.arange(g.cached + g.new).unsqueeze(0)
                masks.append((j <= g.cached + i).to(self.device))
            else:
                masks.append(None)
            off += g.count * g.new
        return Batch(shape, torch.cat(pos).to(self.device), torch.tensor(rows, device=self.device), masks, off)

    def token_ids(self, batch: Batch, generator: torch.Generator) -> torch.Tensor:
        """Random token ids for a batch (timing does not depend on their values)."""
        return torch.randint(0, self.profile.vocab_size, (batch.tokens,), generator=generator).to(self.device)

    def new_cache(self, shape: Shape, generator: torch.Generator | None = None) -> KVCache:
        """KV tensors for the shape, the cached prefix filled with random values."""
        layers = []
        for _ in range(self.num_layers):
            groups = []
            for g in shape.groups:
                size = (g.count, self.Hkv, g.cached + g.new, self.D)
                k = torch.empty(size, dtype=self.dtype, device=self.device)
                v = torch.empty(size, dtype=self.dtype, device=self.device)
                if generator is not None:
                    k.normal_(generator=generator)
                    v.normal_(generator=generator)
                else:
                    k.normal_()
                    v.normal_()
                groups.append((k, v))
            layers.append(groups)
        return KVCache(layers)

    # --- forward, in three parts so that time can be split (layer subsets are scaled) ----------
    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        """Look the ids up in the embedding table."""
        return F.embedding(ids, self.embed)

    def run_layers(self, x: torch.Tensor, batch: Batch, cache: KVCache) -> torch.Tensor:
        """Every decoder layer over the batch, reading and writing each group's KV views."""
        cos = self.cos_table[batch.positions].unsqueeze(1)
        sin = self.sin_table[batch.positions].unsqueeze(1)
        slabs = cache.slabs if batch.decode is not None else [None] * len(cache.layers)
        with self.attention_backends():
            for layer, groups, slab in zip(self.layers, cache.layers, slabs):
                x = self._layer(layer, x, cos, sin, batch, groups, slab)
        return x

    def attention_backends(self):
        """The SDPA backends allowed: torch's own choice, or under `attention="no-cudnn"` on CUDA flash
        attention, then memory-efficient, then math. On an H200 torch 2.11 picked cuDNN's kernels, which
        are fast once warm but build a plan for every attention shape met for the first time (about 50 ms
        for one decode step at a new context length, against 1.6 ms once seen: docs/validation.md, "On an H200");
        a replay, where every iteration's lengths are new, pays that at each step."""
        if self.attention == "torch" or self.device.type != "cuda":
            return contextlib.nullcontext()
        return no_cudnn_kernels()

    def head(self, x: torch.Tensor, batch: Batch) -> torch.Tensor:
        """Final norm, lm_head on each sequence's last position, greedy sampling."""
        last = _rms(x[batch.logit_rows], self.norm)
        return F.linear(last, self.lm_head).argmax(dim=-1)

    def forward(self, ids: torch.Tensor, batch: Batch, cache: KVCache, mark=None) -> torch.Tensor:
        """One iteration: embed, layers, final norm, LM head on the logit rows, greedy tokens."""
        x = self.embed_tokens(ids)
        if mark is not None:
            mark()
        x = self.run_layers(x, batch, cache)
        if mark is not None:
            mark()
        return self.head(x, batch)

    def _decode_attention(self, q, k, v, dec: DecodeRows, slab) -> torch.Tensor:
        """Batched attention of DecodeRows: K/V written into the slabs, the rows gathered up to the longest,
        each kv head's query heads as that head's queries (no K/V repeat), a length mask."""
        ks, vs = slab
        ks[dec.slots, :, dec.positions] = k[dec.rows]
        vs[dec.slots, :, dec.positions] = v[dec.rows]
        length = dec.mask.shape[-1]
        kg, vg = ks[dec.slots, :, :length], vs[dec.slots, :, :length]
        b = dec.rows.shape[0]
        qg = q[dec.rows].view(b, self.Hkv, self.H // self.Hkv, self.D)
        o = F.scaled_dot_product_attention(qg, kg, vg, attn_mask=dec.mask)
        return o.reshape(b, self.H * self.D)

    def _layer(self, layer, x, cos, sin, batch: Batch, groups, slab=None) -> torch.Tensor:
        T, H, Hkv, D = x.shape[0], self.H, self.Hkv, self.D
        qkv = F.linear(_rms(x, layer.w_in), layer.w_qkv, layer.b_qkv)
        q, k, v = qkv.split([H * D, Hkv * D, Hkv * D], dim=-1)
        q, k, v = q.view(T, H, D), k.view(T, Hkv, D), v.view(T, Hkv, D)
        if layer.q_norm is not None:
            q, k = _rms(q, layer.q_norm), _rms(k, layer.k_norm)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        outs, off, dec = [], 0, batch.decode
        if dec is not None:
            attn = q.new_empty(T, H * D)
            attn[dec.rows] = self._decode_attention(q, k, v, dec, slab)
        for i, (g, kv, mask) in enumerate(zip(batch.shape.groups, groups, batch.masks)):
            t = g.count * g.new
            if dec is not None and i in dec.groups:
                off += t
                continue
            kc, vc = kv
            kc[:, :, g.cached:] = k[off:off + t].view(g.count, g.new, Hkv, D).transpose(1, 2)
            vc[:, :, g.cached:] = v[off:off + t].view(g.count, g.new, Hkv, D).transpose(1, 2)
            qg = q[off:off + t].view(g.count, g.new, H, D).transpose(1, 2)
            causal = g.new > 1 and g.cached == 0
            o = F.scaled_dot_product_attention(qg, kc, vc, attn_mask=mask, is_causal=causal, enable_gqa=Hkv != H)
            if dec is not None:
                attn[off:off + t] = o.transpose(1, 2).reshape(t, H * D)
            else:
                outs.append(o.transpose(1, 2).reshape(t, H * D))
            off += t
        if dec is None:
            attn = outs[0] if len(outs) == 1 else torch.cat(outs)
        x = x + F.linear(attn, layer.w_o)
        gate, up = F.linear(_rms(x, layer.w_post), layer.w_gate_up).chunk(2, dim=-1)
        return x + F.linear(F.silu(gate) * up, layer.w_down)
