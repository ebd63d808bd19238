"""One precision type, with one rule for "the same curve", for every report, history line, sweep and watcher.

A probe's numbers depend on what its matrix products ran in, not on what the weights were stored in (float32 shards
gathered in bfloat16 by FSDP compute as bfloat16; float32 weights under TF32 matmuls compute in TF32), and autocast
keeps some operations in float32. So :class:`Precision` is the compute precision and the autocast dtype, if any; the
storage dtype is never compared.
"""

from __future__ import annotations

from dataclasses import dataclass

COMPUTES = ("float32", "tf32", "bfloat16", "float16")  # what matrix products can run in, as records name it
AUTOCASTS = ("bfloat16", "float16")


@dataclass(frozen=True)
class Precision:
    """``compute``: what the matrix products ran in; ``autocast``: the autocast dtype they ran under, or None."""

    compute: str
    autocast: str | None = None

    @classmethod
    def of(cls, record: dict) -> Precision | None:
        """The precision of a report or a history line, or None when it does not say (older records, without
        ``compute``: the autocast dtype, else the weights' dtype)."""
        dtype, autocast, compute = record.get("dtype"), record.get("autocast"), record.get("compute")
        autocast = autocast if isinstance(autocast, str) else None
        compute = compute if isinstance(compute, str) else autocast or dtype
        return cls(compute, autocast) if isinstance(compute, str) else None

    def __str__(self) -> str:
        """``float32``, ``tf32``, or ``bfloat16 (autocast)``."""
        return self.compute if self.autocast is None else f"{self.compute} (autocast)"

    def same_curve(self, other: Precision | None) -> bool:
        """Whether a record of ``other`` may join a curve of this precision (None: unknown, allowed)."""
        return other is None or self == other

    @property
    def dtype(self) -> str:
        """The dtype to load the weights in to score in this precision (TF32 and autocast compute on float32)."""
        return "float32" if self.compute == "tf32" or self.autocast else self.compute

    def options(self) -> str:
        """The command-line options that score in this precision: ``--dtype tf32``, ``--autocast bfloat16``, ..."""
        if self.autocast:
            return f"--dtype float32 --autocast {self.autocast}"
        return f"--dtype {self.compute}"

    @classmethod
    def requested(cls, dtype: str, autocast: str | None = None) -> Precision | None:
        """The precision ``--dtype`` and ``--autocast`` ask for (None: ``--dtype auto`` without ``--autocast``)."""
        if autocast:
            return cls(autocast, autocast)
        return None if dtype == "auto" else cls(dtype)
