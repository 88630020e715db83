"""split_batch never loses a row and splits uneven batches as documented."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from multigpu import InputError, shard_sizes, split_batch


@given(total=st.integers(1, 300), parts=st.integers(1, 16))
def test_concatenating_the_shards_gives_back_the_batch(total, parts):
    if total < parts:
        with pytest.raises(InputError, match=f"{total} example.*{parts} devices"):
            split_batch(np.zeros((total, 2)), np.zeros(total), parts)
        return
    X = np.arange(total * 2).reshape(total, 2)
    y = np.arange(total)
    shards = split_batch(X, y, parts)
    assert len(shards) == parts
    np.testing.assert_array_equal(np.concatenate([s[0] for s in shards]), X)
    np.testing.assert_array_equal(np.concatenate([s[1] for s in shards]), y)
    sizes = [len(s[0]) for s in shards]
    assert sizes == shard_sizes(total, parts)
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def test_length_mismatch_is_an_error():
    with pytest.raises(InputError, match="X has 4 rows but y has 3"):
        split_batch(np.zeros((4, 1)), np.zeros(3), 2)
