"""Scenario schema of disaggregated serving: a prefill pool, a decode pool, and the link between them.

    disaggregation:
      prefill: {replicas: 2, scheduler: {...}}    # scheduler optional: the scenario's by default
      decode:  {replicas: 1}
      link: {bandwidth_gbs: 50, latency_s: 0.0001}  # bandwidth optional: the card's kv_transfer_link

A pool may also carry its own `parallel` layout (the pool's value replaces the scenario's for that
pool). See docs/disaggregation.md.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeFloat, PositiveInt, field_validator

from sim.core.schedulers import AnySchedulerConfig
from sim.io.parallel_schema import ParallelConfig
from sim.io.schema import MAX_REPLICAS, StrictModel
from sim.io.units import parse_bytes


FIRST_TOKEN = ("prefill", "decode_admission", "decode_step", "decode_recompute")
"""Where the client's first token comes from in disaggregated serving (DisaggregationConfig.first_token)."""


class PoolConfig(StrictModel):
    """One pool: how many replicas, and what it does differently from the scenario's defaults."""

    replicas: PositiveInt = Field(le=MAX_REPLICAS, description="Replicas in this pool (each spans the pool's layout of GPUs)")
    scheduler: AnySchedulerConfig | None = Field(None, description="This pool's scheduler (default: the scenario's)")
    kv_budget: int | None = Field(
        None, ge=1, description="This pool's kv.budget in bytes per replica (e.g. 120GiB; default: the scenario's)")
    parallel: ParallelConfig | None = Field(
        None, description="This pool's parallel layout {tp, pp, ep} (default: the scenario's `parallel`)")

    @field_validator("kv_budget", mode="before")
    @classmethod
    def _bytes(cls, v):
        return None if v is None else parse_bytes(v)


class LinkConfig(StrictModel):
    """The link prefill replicas send KV over to decode replicas (per GPU, one direction)."""

    bandwidth_gbs: float | None = Field(
        None, ge=1e-3, description="GB/s (1e9 B/s) per GPU, one direction, at least 0.001 (1 MB/s); default: the "
        "hardware profile's kv_transfer_link")
    latency_s: NonNegativeFloat = Field(0.0, description="Fixed cost per transfer (handshake, first byte), seconds")


class DisaggregationConfig(StrictModel):
    """Prefill in one pool, decode in another, the prompt's KV sent between them."""

    prefill: PoolConfig
    decode: PoolConfig
    link: LinkConfig = Field(default_factory=LinkConfig)
    first_token: Literal[FIRST_TOKEN] = Field(
        "prefill", description="When the client gets the first token (docs/disaggregation.md): prefill (the prefill "
        "pool's token at once), decode_admission (sent with the KV, streamed when a decode replica takes the request "
        "into its batch: SGLang), decode_step (the decode replica's first response, after its first iteration with "
        "the request: TensorRT-LLM), decode_recompute (the decode replica computes the last prompt token again and "
        "samples the first token itself: vLLM's NIXL connector)")
    decode_preallocation: bool = Field(
        False, description="The decode replica is chosen when the request arrives and must take it (pre-allocate its "
        "KV slots, at a pass of its engine loop that takes arrivals: scheduler.recv_interval) before the prefill pool "
        "may start it; the KV then goes to that replica (SGLang's bootstrap: the prefill server waits for the decode "
        "server's KV indices; docs/disaggregation.md)")
    wait_for_prefill_response: bool = Field(
        False, description="The client's stream starts only once the prefill replica has answered too, which it does "
        "between its iterations once the KV has been sent: a first token ready sooner waits for the end of the "
        "prefill iteration running when the transfer ended (SGLang's router waits for both servers' responses, "
        "sgl-project/sglang#22853; docs/disaggregation.md)")
