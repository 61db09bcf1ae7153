"""Driving an :class:`Engine` to the end in plain steps or in the overlapped order."""

from __future__ import annotations

from collections.abc import Iterator

from local_engine.engine import Engine, RequestOutput, StepTokens

__all__ = ["step_rounds"]


def step_rounds(engine: Engine, *, overlapped: bool) -> Iterator[list[RequestOutput]]:
    """Yield each round's outputs until the engine is idle; the caller may add or abort
    requests between rounds. ``overlapped`` runs step n+1 (``run_step``) before making
    step n's outputs (``process_step``), the order :class:`AsyncEngine` overlaps them in,
    without threads; otherwise each round is one ``step()``."""
    pending: StepTokens | None = None
    while engine.has_unfinished() or pending is not None:
        if not overlapped:
            yield engine.step()
            continue
        ran = engine.run_step() if engine.has_unfinished() else None
        if pending is not None:
            yield engine.process_step(pending)
        pending = ran
