"""cuda_graph."""
