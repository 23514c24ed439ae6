"""CUDA-graph capture and replay over static buffers; knows nothing of EAGLE or models."""

from specdec.cuda_graph.runner import WRITTEN, CudaGraphRunner, StaticInput, default_batch_sizes, padded_lengths

__all__ = ["WRITTEN", "CudaGraphRunner", "StaticInput", "default_batch_sizes", "padded_lengths"]
