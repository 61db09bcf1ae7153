"""GPU attention backend on the Triton kernels of :mod:`.triton_kernels`.

A step stores its keys and values with one kernel, then attends with the decode kernel when
every sequence has one new token (the shape CUDA graphs replay) or with the prefill/extend
kernel otherwise (mixed batches included: a decode row is a one-token query). Everything
the kernels read comes from the step's device tensors, so the decode path is graph-safe.

It runs on CUDA tensors, and on CPU tensors only under the Triton interpreter
(``TRITON_INTERPRET=1`` set before the kernels are first imported), which is how the tests
check it against :class:`~local_engine.attention.reference.ReferenceAttention`.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

import torch

from local_engine.errors import EngineConfigError

from .base import AttentionMetadata

__all__ = ["TritonPagedAttention", "triton_available"]

_MIN_BLOCK = 16


def triton_available() -> bool:
    """Whether the :mod:`triton` package can be imported here."""
    return importlib.util.find_spec("triton") is not None


def _kernels() -> ModuleType:
    try:
        return importlib.import_module("local_engine.attention.triton_kernels")
    except ImportError as exc:
        raise EngineConfigError(
            "the 'triton' attention backend needs the triton package "
            "(pip install triton; it comes with CUDA builds of torch)"
        ) from exc


class TritonPagedAttention:
    """Paged attention on Triton kernels: KV store, split-KV decode, prefill/extend."""

    name = "triton"

    def __init__(self, *, num_splits: int | None = None) -> None:
        """Import the kernels now (so a missing triton fails at configuration time).

        Args:
            num_splits: context splits of the decode kernel (a power of two); the kernels'
                default when None.

        Raises:
            EngineConfigError: triton is missing, or ``num_splits`` is not a power of two.
        """
        self._k = _kernels()
        splits = self._k.DEFAULT_NUM_SPLITS if num_splits is None else num_splits
        if isinstance(splits, bool) or not isinstance(splits, int) or splits < 1:
            raise EngineConfigError(f"num_splits must be a positive power of two, got {splits!r}")
        if splits & (splits - 1):
            raise EngineConfigError(f"num_splits must be a power of two, got {splits}")
        self.num_splits: int = splits

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        *,
        scale: float,
        sliding_window: int | None,
    ) -> torch.Tensor:
        """Write ``k``/``v`` into ``kv_cache`` and attend; see :class:`AttentionBackend`.

        Raises:
            EngineConfigError: CPU tensors without the interpreter, or a block size that
                is not a power of two of at least 16.
        """
        self._check(q, kv_cache)
        self._k.store_kv(k, v, kv_cache, meta.slot_mapping)
        if meta.max_query_len == 1:
            return self._k.paged_decode(  # type: ignore[no-any-return]
                q,
                kv_cache,
                meta.block_tables,
                meta.context_lens,
                scale=scale,
                window=sliding_window,
                num_splits=self.num_splits,
            )
        return self._k.paged_prefill(  # type: ignore[no-any-return]
            q,
            kv_cache,
            meta.block_tables,
            meta.context_lens,
            meta.query_start_loc,
            meta.max_query_len,
            scale=scale,
            window=sliding_window,
        )

    def _check(self, q: torch.Tensor, kv_cache: torch.Tensor) -> None:
        if q.device.type != "cuda" and not self._k.INTERPRETING:
            raise EngineConfigError(
                "the 'triton' attention backend runs on CUDA tensors (or on CPU under "
                f"TRITON_INTERPRET=1), not on {q.device.type}"
            )
        block_size = kv_cache.shape[2]
        if block_size < _MIN_BLOCK or block_size & (block_size - 1):
            raise EngineConfigError(
                f"the 'triton' attention backend needs a block_size that is a power of two "
                f"of at least {_MIN_BLOCK}, got {block_size}"
            )
