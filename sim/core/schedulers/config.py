"""The settings every scheduling policy has (each policy's config extends SchedulerConfig), and the check that a
token budget holds the running decodes."""

from __future__ import annotations

from pydantic import Field, NonNegativeInt, PositiveInt, model_validator

from sim.io.schema import StrictModel


def check_budget_holds_decodes(cfg) -> None:
    """A token budget smaller than max_num_seqs could not give every running decode its token."""
    if cfg.max_num_batched_tokens < cfg.max_num_seqs:
        raise ValueError(f"scheduler.max_num_batched_tokens ({cfg.max_num_batched_tokens}) must be >= "
                         f"scheduler.max_num_seqs ({cfg.max_num_seqs}) so every running decode fits")


class SchedulerConfig(StrictModel):
    """Settings every policy has."""

    max_num_seqs: PositiveInt = Field(256, description="Most requests running at once")
    async_scheduling: bool = Field(False, description="Plan the next iteration while this one runs (async / overlap "
                                   "scheduling): a request arriving mid-iteration joins one later; idle, at once")
    recv_interval: PositiveInt = Field(1, description="Take newly arrived requests only every Nth pass while decoding "
                                       "(SGLang's --scheduler-recv-interval): a pass after a decode-only iteration "
                                       "counts 1, after any other iteration N; idle, at once")
    attention_dp_balance_iters: NonNegativeInt = Field(0, description="parallel.attention_dp > 1: hold new requests "
        "until there is one a rank, at most N passes while each rank decodes (TensorRT-LLM's attention_dp_config "
        "enable_balance, timeout_iters N; sim.core.engine.BalanceGate). 0: off; not with recv_interval")
    batch_wait_iters: NonNegativeInt = Field(0, description="Hold new requests while others decode, for at most N "
        "passes, until their prompt tokens and the decoding sequences' tokens reach batch_wait_tokens, so prompts "
        "prefill together (TensorRT-LLM's batch_wait_timeout_iters; sim.core.engine.BatchWaitGate). 0: off; set with "
        "batch_wait_tokens")
    batch_wait_tokens: NonNegativeInt = Field(0, description="The tokens that end batch_wait_iters' hold early "
        "(TensorRT-LLM's batch_wait_max_tokens_ratio x max_num_tokens). 0: off; set with batch_wait_iters")

    @model_validator(mode="after")
    def _one_gate(self):  # each of these decides which pass takes arrivals
        if (self.batch_wait_iters > 0) != (self.batch_wait_tokens > 0):
            raise ValueError("scheduler: batch_wait_iters and batch_wait_tokens hold prompts together (the hold ends "
                             "at whichever is reached first, so either alone never holds): set both or neither")
        gates = [name for name, on in (("recv_interval", self.recv_interval > 1),
                                       ("attention_dp_balance_iters", self.attention_dp_balance_iters > 0),
                                       ("batch_wait_iters", self.batch_wait_iters > 0)) if on]
        if len(gates) > 1:
            raise ValueError(f"scheduler: {' and '.join(gates)} each gate arrivals; set one")
        return self
