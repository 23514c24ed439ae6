"""Throughput benchmark: same as ``specdec bench`` (see specdec/benchmark.py)."""

from specdec.benchmark import main

if __name__ == "__main__":
    main()
