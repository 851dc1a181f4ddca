"""Scenario schema of a replica's parallel layout (`parallel: {tp: 4, pp: 1, ep: 1}`).

Kept apart from sim.models.parallel (the arithmetic) so that sim.io.config validates scenarios without
loading model profiles; whether a model can take a layout (heads, experts, layers) is checked against
the model by sim.models.parallel.check_layout when the simulation or `capsim memory` loads it.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, NonNegativeFloat, model_validator

from sim.io.errors import FieldValueError
from sim.io.schema import StrictModel

MAX_GPUS = 1024
"""Most GPUs of one replica's layout (any degree above it is a typo)."""
Degree = Annotated[int, Field(ge=1, le=MAX_GPUS)]


class ParallelConfig(StrictModel):
    """How one replica spans GPUs: attention_dp x tp x pp GPUs. Attention and dense FFNs are split over the tp GPUs of
    a stage (KV heads replicated when tp exceeds them); MoE layers split their experts over `ep` of those
    tp GPUs and each expert over the remaining tp / ep; layers are split into pp pipeline stages."""

    tp: Degree = Field(1, description="Tensor-parallel GPUs per pipeline stage")
    pp: Degree = Field(1, description="Pipeline stages (consecutive layers per stage)")
    ep: Degree = Field(1, description="Expert-parallel GPUs (MoE only): divides tp; experts are whole on a GPU "
                                      "when ep = tp, else split tp / ep ways")
    micro_batches: Degree = Field(1, description="Pipeline micro-batches an iteration is split into (pp > 1): the "
                                                 "bubble is (pp - 1) / (micro_batches + pp - 1) of the stage time")
    expert_imbalance: Annotated[float, Field(ge=1.0, le=64.0)] = Field(
        1.0, description="Tokens on the busiest expert-parallel GPU / the mean (1 = perfectly balanced); an "
                         "iteration waits for the busiest GPU")
    ep_communication: Literal["all_reduce", "all_to_all"] = Field(
        "all_reduce", description="How MoE outputs meet under ep > 1: all_reduce (attention tensor-parallel: every "
                                  "GPU holds every token, so only the combine costs, as vLLM and TensorRT-LLM do "
                                  "without attention data parallelism) or all_to_all (dispatch and combine of the "
                                  "routed tokens, DeepEP-style; refused with ep 1)")
    attention_dp: Degree = Field(1, description="Attention data-parallel ranks (MoE models): each rank is tp x pp GPUs "
                                                "with its own requests, KV cache and copy of everything but the "
                                                "routed experts, which spread over all ranks' GPUs (ep divides "
                                                "attention_dp x tp); the scheduler's limits are the replica's, "
                                                "over all ranks; a sequence runs on one rank and an iteration "
                                                "waits for the busiest (ceil(n / attention_dp) of its prompts "
                                                "and of its decodes)")
    attention_dp_routing: Literal["shared_queue", "random", "round_robin", "least_loaded"] = Field(
        "shared_queue", description="How attention_dp ranks get their requests: shared_queue (the ranks draw from one "
                                    "queue, each pass spread evenly over them; the default), or each request bound "
                                    "to one rank when it arrives and queued there (sim.core.schedulers.ranked): "
                                    "random (SGLang's disaggregated workers: the rank is the router's random "
                                    "bootstrap room modulo attention_dp), round_robin (SGLang's aggregated DP "
                                    "controller) or least_loaded (the rank with the fewest requests waiting or "
                                    "running). Bound ranks have the scheduler's limits / attention_dp each and an "
                                    "iteration waits for the busiest rank's actual load")
    routing_skew: NonNegativeFloat = Field(
        0.0, le=8.0, description="Zipf exponent of expert popularity (0 = uniform routing): skewed routing "
                                 "touches fewer distinct experts, so fewer expert weights are read")

    @model_validator(mode="after")
    def _ep_divides_tp(self):
        experts = self.tp * self.attention_dp
        if experts % self.ep:
            allowed = [d for d in range(1, experts + 1) if experts % d == 0]
            if self.attention_dp == 1:
                raise FieldValueError("ep", f"ep ({self.ep}) must divide tp ({self.tp}): expert-parallel GPUs are "
                                      f"the tensor-parallel GPUs of a stage; allowed ep for tp {self.tp}: {allowed}")
            raise FieldValueError("ep", f"ep ({self.ep}) must divide attention_dp x tp ({experts}): expert-parallel "
                                  f"GPUs are the GPUs of a stage; allowed ep for attention_dp {self.attention_dp}, "
                                  f"tp {self.tp}: {allowed}")
        if self.ep_communication == "all_to_all" and self.ep == 1:
            raise FieldValueError("ep_communication", "ep_communication all_to_all moves tokens between expert-"
                                  "parallel GPUs, and ep 1 has none; allowed with ep 1: all_reduce (or leave it out), "
                                  "or give ep > 1")
        if self.attention_dp_routing != "shared_queue" and self.attention_dp == 1:
            raise FieldValueError("attention_dp_routing", f"attention_dp_routing {self.attention_dp_routing} binds "
                                  "requests to attention data-parallel ranks, and attention_dp 1 has one; allowed "
                                  "with attention_dp 1: shared_queue (or leave it out), or give attention_dp > 1")
        if self.micro_batches > 1 and self.pp == 1:
            raise FieldValueError("micro_batches", f"micro_batches ({self.micro_batches}) needs pp > 1 (pipeline "
                                  "stages); allowed: 1")
        return self

    @property
    def gpus(self) -> int:
        """GPUs of one replica."""
        return self.tp * self.pp * self.attention_dp
