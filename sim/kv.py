"""KV block accounting: a pool of fixed-size blocks and each request's allocation.

This pool counts blocks per request (paged allocation, ceil(tokens / block_tokens) blocks).
Operations come in can_x / x pairs so a scheduler asks before it mutates.
"""

from __future__ import annotations

from sim.request import Request


class BlockPool:
    def __init__(self, num_blocks: int, block_tokens: int, block_bytes: float):
        if num_blocks < 1:
            raise ValueError(f"KV pool must hold at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.block_tokens = block_tokens
        self.block_bytes = block_bytes
        self.used_blocks = 0
        self.peak_blocks = 0

    @property
    def free_blocks(self) -> int:
        return self.num_blocks - self.used_blocks

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_tokens)

    def can_allocate(self, req: Request, tokens: int) -> bool:
        """Can `req` grow to hold `tokens` tokens of KV?"""
        return self.blocks_for(tokens) - req.num_blocks <= self.free_blocks

    def allocate(self, req: Request, tokens: int) -> None:
        extra = self.blocks_for(tokens) - req.num_blocks
        if extra <= 0:
            return
        if extra > self.free_blocks:
            raise RuntimeError(f"request {req.rid}: allocate {extra} blocks with {self.free_blocks} free; "
                               "call can_allocate first")
        req.num_blocks += extra
        self.used_blocks += extra
        if self.used_blocks > self.peak_blocks:
            self.peak_blocks = self.used_blocks

    def free(self, req: Request) -> None:
        self.used_blocks -= req.num_blocks
        req.num_blocks = 0
