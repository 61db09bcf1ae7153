"""The loader's copy target for a row range of a quantized weight (int8, int4 or fp8)."""

from __future__ import annotations

from typing import Protocol

import torch

from local_engine.errors import EngineConfigError

__all__ = ["QuantizedRows"]

CHUNK_VALUES = 1 << 22
"""Rows are quantized this many weight values at a time (a few float32 temporaries of 16 MiB
each), so loading a large matrix makes no float32 copies of all of it."""


class _Codes(Protocol):
    """A quantized weight: codes and scales with one row per output row."""

    qweight: torch.Tensor
    scales: torch.Tensor

    @property
    def shape(self) -> torch.Size:
        """The shape ``[N, K]`` of the weight it stands for."""
        ...


class QuantizedRows:
    """Rows ``start:stop`` of a quantized weight: ``copy_(src)`` quantizes ``src`` (any float
    dtype) into them with :meth:`quantize`, which each format defines."""

    row_multiple = 1
    """Blocks of rows :meth:`copy_` quantizes at a time are a multiple of this many rows."""

    def __init__(self, weight: _Codes, start: int, stop: int) -> None:
        """Target rows ``start:stop`` of ``weight``."""
        self.weight = weight
        self.start = start
        self.stop = stop

    def quantize(self, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Codes and scales for the rows ``src``."""
        raise NotImplementedError

    def copy_(self, src: torch.Tensor) -> None:
        """Quantize ``src [stop - start, in_features]`` into the rows, a block of rows
        (:data:`CHUNK_VALUES` values) at a time.

        Raises:
            EngineConfigError: ``src`` has another shape.
        """
        expected = (self.stop - self.start, self.weight.shape[1])
        if tuple(src.shape) != expected:
            raise EngineConfigError(f"expected a {expected} weight, got {tuple(src.shape)}")
        step = max(1, CHUNK_VALUES // max(1, expected[1]))
        step = max(self.row_multiple, step // self.row_multiple * self.row_multiple)
        with torch.no_grad():
            for lo in range(0, expected[0], step):
                hi = min(lo + step, expected[0])
                codes, scales = self.quantize(src[lo:hi])
                self._store(self.start + lo, self.start + hi, codes, scales)

    def _store(self, start: int, stop: int, codes: torch.Tensor, scales: torch.Tensor) -> None:
        """Write :meth:`quantize`'s codes and scales into rows ``start:stop``."""
        self.weight.qweight[start:stop].copy_(codes)
        self.weight.scales[start:stop].copy_(scales)
