"""What every loader returns, and helpers they share."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class LoadResult:
    path: str
    format: str            # 'kineto-json', 'kineto-json.gz', 'nsys-sqlite', 'nsys-rep'
    source: str            # 'kineto' or 'nsys' (the `source` column of every row)
    producer: str = ""     # 'torch 2.11.0', 'nsys 2025.3.1', ... when known
    start_ns: int | None = None
    end_ns: int | None = None
    events: int = 0        # rows loaded into the store
    warnings: list[str] = field(default_factory=list)
