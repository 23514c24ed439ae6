"""Drafting without a trained head: draft tokens looked up in the request's own tokens (n-gram
matching, SGLang's NGRAM and vLLM's ``ngram`` prompt lookup). Imports nothing else of ours."""

from specdec.ngram.lookup import NgramLookup, propose_ngram, propose_ngram_ref

__all__ = ["NgramLookup", "propose_ngram", "propose_ngram_ref"]
