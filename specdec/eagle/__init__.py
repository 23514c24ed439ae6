"""The EAGLE worker: draft-tree expansion, tree building, verification, commit and draft extend."""

from specdec.eagle.output import DecodeOutput, PendingDecode
from specdec.eagle.worker import EAGLEWorker

__all__ = ["DecodeOutput", "EAGLEWorker", "PendingDecode"]
