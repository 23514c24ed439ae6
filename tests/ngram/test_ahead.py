"""``AheadGuess`` (specdec/ngram/ahead.py): a lookup ahead of the step in flight builds on that step's
path only where the step was drafted from the tokens since read; the module docstring's example."""

import numpy as np

from specdec.ngram.ahead import AheadGuess


def _table(rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    token_ids = np.full((len(rows), 16), -7, dtype=np.int32)  # poison past each row's tokens
    for r, tokens in enumerate(rows):
        token_ids[r, : len(tokens)] = tokens
    return token_ids, np.asarray([len(t) for t in rows])


def test_the_step_in_flight_is_built_upon_only_where_its_guess_was_right():
    """Both rows read ... 5 9 when step t + 1 launched ahead of step t, assuming t commits [7 2] and
    drafting [5 9]. Row 0's t committed 7 2 (as assumed), row 1's 7 8."""
    guess = AheadGuess(max_reqs=2, width=4)
    rows = np.asarray([0, 1])
    guess.launched(rows, read=np.asarray([4, 4]), path=np.asarray([[5, 9], [5, 9]]), path_len=np.asarray([2, 2]),
                   assumed=np.asarray([[7, 2], [7, 2]]), assumed_len=np.asarray([2, 2]))
    token_ids, num_tokens = _table([[1, 3, 5, 9, 7, 2], [1, 3, 5, 9, 7, 8]])
    got = guess.guessed_history(rows, token_ids, num_tokens)
    assert got.read.tolist() == [6, 6] and got.lengths.tolist() == [8, 6]
    assert got.history[0, :8].tolist() == [1, 3, 5, 9, 7, 2, 5, 9]
    assert got.history[1, :6].tolist() == [1, 3, 5, 9, 7, 8]


def test_a_step_that_read_first_or_decoded_plainly():
    """A step launched with nothing in flight assumed nothing: its path holds if no token was read
    since (row 0); a plain step drafted nothing (row 1); a row reset for a new request (row 2) reads
    its history alone, and one whose tokens are not read yet (row 3) has none."""
    guess = AheadGuess(max_reqs=4, width=3)
    guess.launched(np.asarray([0, 1]), read=np.asarray([3, 3]), path=np.asarray([[4, 6, 8], [0, 0, 0]]),
                   path_len=np.asarray([3, 0]))
    guess.reset([2, 3])
    token_ids, num_tokens = _table([[1, 2, 3], [1, 2, 3], [5, 5], []])
    got = guess.guessed_history(np.arange(4), token_ids, num_tokens)
    assert got.lengths.tolist() == [6, 3, 2, 0]
    assert got.history[0, :6].tolist() == [1, 2, 3, 4, 6, 8]
    # row 0 again, one token read since: the path (drafted after token 3) no longer follows
    token_ids, num_tokens = _table([[1, 2, 3, 4]])
    assert guess.guessed_history(np.asarray([0]), token_ids, num_tokens).lengths.tolist() == [4]
