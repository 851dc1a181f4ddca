"""The replay's KV slots: per live request, per layer, a K and a V row of one slab per layer.

A slot is a row of every layer's K and V slabs [slots, kv_heads, capacity, head_dim], sized for a
request's whole sequence (prompt + outputs + draft lookahead); a group's cache is the row's view
[:, :, :cached + new], and a batched decode step indexes the slabs by row (calibration.model.DecodeRows).
The rows are made up front for the scenario's max_num_seqs (outside the timed run); a request beyond
them gets tensors of its own, which only the per-request path can use. Slots are reused after a request
leaves.
"""

from __future__ import annotations

import torch

from calibration.model import ReferenceModel


class KVSlots:
    """Per request, per layer: K and V views of shape [1, kv_heads, capacity, head_dim] (slab rows when
    reserved up front); `row_of(rid)` is the request's slab row, or None for a slot of its own."""

    def __init__(self, model: ReferenceModel, capacity: int):
        self.model, self.capacity = model, capacity
        self.free: list[tuple[int | None, list[tuple[torch.Tensor, torch.Tensor]]]] = []
        self.held: dict[int, tuple[int | None, list[tuple[torch.Tensor, torch.Tensor]]]] = {}
        self.slabs: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self.created = 0

    def _zeros(self, rows: int) -> torch.Tensor:
        m = self.model
        return torch.zeros((rows, m.Hkv, self.capacity, m.D), dtype=m.dtype, device=m.device)

    def _new(self) -> tuple[None, list[tuple[torch.Tensor, torch.Tensor]]]:
        self.created += 1
        return None, [(self._zeros(1), self._zeros(1)) for _ in range(self.model.num_layers)]

    def reserve(self, n: int) -> None:
        """Create n slots up front (outside the timed run), as rows of one K and one V slab per layer."""
        if self.slabs is None and n > 0:
            self.slabs = [(self._zeros(n), self._zeros(n)) for _ in range(self.model.num_layers)]
            self.created += n
            self.free = [(r, [(k[r:r + 1], v[r:r + 1]) for k, v in self.slabs]) for r in reversed(range(n))]
        while len(self.free) + len(self.held) < n:
            self.free.append(self._new())

    def of(self, rid: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The K/V slot of request `rid` (taken from the free list, or made, the first time)."""
        return self._slot(rid)[1]

    def row_of(self, rid: int) -> int | None:
        """The slab row of request `rid`'s slot (None: a slot of its own, outside the slabs)."""
        return self._slot(rid)[0]

    def _slot(self, rid: int):
        slot = self.held.get(rid)
        if slot is None:
            slot = self.free.pop() if self.free else self._new()
            self.held[rid] = slot
        return slot

    def release(self, rid: int) -> None:
        """Give `rid`'s slot back to the free list."""
        slot = self.held.pop(rid, None)
        if slot is not None:
            self.free.append(slot)

    @property
    def bytes_per_slot(self) -> int:
        m = self.model
        return 2 * m.num_layers * m.Hkv * self.capacity * m.D * m.dtype.itemsize
