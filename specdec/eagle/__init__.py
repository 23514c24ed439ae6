"""The EAGLE worker: draft-tree expansion, tree building, verification, commit and draft extend."""

from specdec.eagle.worker import DecodeOutput, EAGLEWorker

__all__ = ["DecodeOutput", "EAGLEWorker"]
