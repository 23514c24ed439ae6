"""Drafting without a trained head: draft tokens looked up in the request's own tokens (n-gram
matching, SGLang's NGRAM and vLLM's ``ngram`` prompt lookup). ``lookup`` imports nothing else of
ours; the worker (``specdec.ngram.worker``, imported on its own) verifies with ``specdec.eagle``'s
tree verification."""

from specdec.ngram.lookup import NgramLookup, propose_ngram, propose_ngram_ref

__all__ = ["NgramLookup", "propose_ngram", "propose_ngram_ref"]
