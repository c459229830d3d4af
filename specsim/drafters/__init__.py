"""Drafters' proposal rules that need no model: prompt lookup (``ngram``).

One rule, shared by the real engine (incrementally, per request) and the profiler (over a
whole text); the model drafters live in ``specsim.models``.
"""

from specsim.drafters.ngram import DEFAULT_NGRAM, PromptLookup, parse_ngram, proposals

__all__ = ["DEFAULT_NGRAM", "PromptLookup", "parse_ngram", "proposals"]
