"""What every benchmark result records: when, on what, at which commit."""

from __future__ import annotations

import datetime
import os
import subprocess

import torch


def run_metadata() -> dict:
    commit = os.environ.get("SPECDEC_COMMIT")
    if not commit and os.path.exists(".commit"):  # NOTE: on the device the tree's git HEAD is the session's first
        with open(".commit") as f:  # commit, not the working tree's: scripts write .commit before a call
            commit = f.read().strip()
    if not commit:
        try:
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                    timeout=5).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            commit = ""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit or "unknown",
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "triton": triton_version,
    }


def metadata_line(meta: dict) -> str:
    return f"{meta['date']} · {meta['device']} · commit {meta['commit']} · torch {meta['torch']} · triton {meta['triton']}"
