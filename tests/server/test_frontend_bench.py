"""benchmarks/bench_server_frontend.py: the server's process before an engine that costs nothing, end to end."""

import re
import subprocess
import sys

from ..serve_process import REPO, free_port


def test_the_frontend_benchmark_runs_end_to_end():
    out = subprocess.run([sys.executable, "benchmarks/bench_server_frontend.py", "--concurrency", "2",
                          "--max-new-tokens", "8", "--step-ms", "1", "--port", str(free_port())],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    match = re.search(r"concurrency 2: ([\d.]+) token/s", out.stdout)
    assert match and float(match.group(1)) > 0, out.stdout
