"""NgramConfig: the n-gram drafter's settings, named after SGLang's ``--speculative-ngram-*`` flags.

    min_match_window / max_match_window   n-gram lengths matched against the request's own tokens
                                          (``--speculative-ngram-{min,max}-match-window-size``)
    min_bfs_breadth / max_bfs_breadth     children kept at the tree's root for the longest / the
                                          shortest match, one fewer per ``scale`` a level deeper
                                          (``--speculative-ngram-{min,max}-bfs-breadth``)
    match_type                            BFS: children by recency; PROB: by frequency, nodes by
                                          path probability (``--speculative-ngram-match-type``)
    num_draft_tokens (N)                  tree nodes verified per request, root included
                                          (``--speculative-num-draft-tokens``; default: the
                                          largest match window, as SGLang's)
    cache_capacity                        tokens the cross-request cache holds (``cache.py``;
                                          ``--speculative-ngram-capacity``; 0: no cache)
    cache_branch_length                   longest window of a finished request it stores, key
                                          and continuation (``--speculative-ngram-branch-length``)
    device_lookup                         drafts chains on the device (``specdec.kernels.ngram_match``),
                                          so a lookup launches past the unread step like a plain one;
                                          False: trees on the host, each lookup reading the step before
                                          it. The host (``specdec.engine.ngram_setup``) turns it on
                                          unless a tree, PROB or the cache is asked for.

The config is frozen and validates itself (messages name the flag).
"""

from __future__ import annotations

import dataclasses

from specdec.config import ConfigError

MATCH_TYPES = ("BFS", "PROB")
# SGLang's defaults
DEFAULT_MIN_MATCH_WINDOW = 1
DEFAULT_MAX_MATCH_WINDOW = 12
DEFAULT_MIN_BFS_BREADTH = 1
DEFAULT_MAX_BFS_BREADTH = 10
DEFAULT_BRANCH_LENGTH = 18


@dataclasses.dataclass(frozen=True)
class NgramConfig:
    num_draft_tokens: int = DEFAULT_MAX_MATCH_WINDOW
    min_match_window: int = DEFAULT_MIN_MATCH_WINDOW
    max_match_window: int = DEFAULT_MAX_MATCH_WINDOW
    min_bfs_breadth: int = DEFAULT_MIN_BFS_BREADTH
    max_bfs_breadth: int = DEFAULT_MAX_BFS_BREADTH
    match_type: str = "BFS"
    # adaptive: per-request draft budgets and per-step verify sizes (specdec.ngram.budget); off:
    # every step that has a match verifies N nodes a request
    adaptive: bool = True
    # a step verifies at most this many rows (bs x nodes); 0: no limit (adaptive only)
    max_verify_rows: int = 512
    # the cross-request cache (specdec.ngram.cache): off unless given a capacity. NOTE: SGLang's
    # default is 10 M trie nodes; held as Python tuples that would cost GBs, so specdec asks for it
    cache_capacity: int = 0
    cache_branch_length: int = DEFAULT_BRANCH_LENGTH
    device_lookup: bool = False

    def __post_init__(self) -> None:
        ints = (("--speculative-num-draft-tokens", self.num_draft_tokens, 2),
                ("--speculative-ngram-min-match-window-size", self.min_match_window, 1),
                ("--speculative-ngram-max-match-window-size", self.max_match_window, 1),
                ("--speculative-ngram-min-bfs-breadth", self.min_bfs_breadth, 1),
                ("--speculative-ngram-max-bfs-breadth", self.max_bfs_breadth, 1),
                ("--speculative-adaptive-max-verify-rows", self.max_verify_rows, 0),
                ("--speculative-ngram-capacity", self.cache_capacity, 0),
                ("--speculative-ngram-branch-length", self.cache_branch_length, 2))
        for flag, value, low in ints:
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"{flag} must be an integer >= {low}, got {value!r}")
        if self.min_match_window > self.max_match_window:
            raise ConfigError(f"--speculative-ngram-min-match-window-size={self.min_match_window} exceeds "
                              f"--speculative-ngram-max-match-window-size={self.max_match_window}")
        if self.min_bfs_breadth > self.max_bfs_breadth:
            raise ConfigError(f"--speculative-ngram-min-bfs-breadth={self.min_bfs_breadth} exceeds "
                              f"--speculative-ngram-max-bfs-breadth={self.max_bfs_breadth}")
        if self.match_type not in MATCH_TYPES:
            raise ConfigError(f"--speculative-ngram-match-type={self.match_type!r}: choose one of {list(MATCH_TYPES)}")
        if self.device_lookup and (not self.is_chain or self.match_type != "BFS" or self.cache_capacity):
            raise ConfigError("device lookups draft chains from the request's own tokens: not with "
                              "--speculative-ngram-max-bfs-breadth > 1, --speculative-ngram-match-type PROB or "
                              "--speculative-ngram-capacity")

    @property
    def max_nodes(self) -> int:
        """Draft nodes per request, the root not counted (N - 1)."""
        return self.num_draft_tokens - 1

    @property
    def is_chain(self) -> bool:
        return self.max_bfs_breadth == 1

    @property
    def breadth_scale(self) -> float:
        """Breadth lost per match token and per tree level (SGLang's ``bfs_breadth_scale``)."""
        return (self.max_bfs_breadth - self.min_bfs_breadth) / (self.max_match_window - self.min_match_window + 1)

    def root_breadth(self, match_len: int) -> float:
        """Children of the root for a match of ``match_len`` tokens: a long match is trusted, so it
        branches least (near ``max_bfs_breadth`` at the shortest window, ``min_bfs_breadth`` at the longest)."""
        return (self.max_match_window - match_len) * self.breadth_scale + self.min_bfs_breadth
