"""specsim: profile, simulate and plan speculative decoding for LLM serving fleets.

Notation throughout: p is the target model's next-token distribution, q the drafter's, and k the
number of tokens drafted per speculative step (k = 0 means speculation off).
"""

__version__ = "0.1.0"
