"""Multi-rank jobs: a layer above the one-trace analysis (docs/distributed.md)."""
