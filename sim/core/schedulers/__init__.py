"""The scheduler registry: one explicit dict, and the tagged union built from the same table."""

from __future__ import annotations

from typing import Annotated, Union

from pydantic import Field

from sim.core.schedulers.base import Scheduler, SchedulerConfig, StepPlan
from sim.core.schedulers.chunked import ChunkedConfig, ChunkedPrefill
from sim.core.schedulers.continuous import ContinuousBatching, ContinuousConfig
from sim.core.schedulers.fixed import FixedBatching, FixedConfig
from sim.core.schedulers.vllm_v1 import VllmV1, VllmV1Config

_BUILTINS: tuple[tuple[type[SchedulerConfig], type[Scheduler]], ...] = (
    (FixedConfig, FixedBatching),
    (ContinuousConfig, ContinuousBatching),
    (ChunkedConfig, ChunkedPrefill),
    (VllmV1Config, VllmV1),
)


def _registry() -> dict[str, tuple[type[SchedulerConfig], type[Scheduler]]]:
    table: dict[str, tuple[type[SchedulerConfig], type[Scheduler]]] = {}
    for cfg, cls in _BUILTINS:
        if cls.kind in table:
            raise RuntimeError(f"scheduler kind {cls.kind!r} registered twice")
        table[cls.kind] = (cfg, cls)
    return table


SCHEDULERS = _registry()
AnySchedulerConfig = Annotated[Union[tuple(cfg for cfg, _ in _BUILTINS)], Field(discriminator="kind")]

__all__ = ["SCHEDULERS", "AnySchedulerConfig", "Scheduler", "SchedulerConfig", "StepPlan"]
