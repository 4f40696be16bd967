"""fork_map: forked workers see the parent's objects, results come back in order, errors surface."""
import os

import pytest

from tensorplan.forkmap import fork_map, fork_map_iter, spans


def test_results_in_order_and_computed_in_children():
    data = [object() for _ in range(50)]          # not picklable in a useful way: children inherit them
    parent = os.getpid()

    def job(a, b):
        return [(k, id(data[k]), os.getpid()) for k in range(a, b)]
    out = fork_map(job, len(data), workers=2, chunk=7)
    assert [k for k, _, _ in out] == list(range(50))
    assert [i for _, i, _ in out] == [id(x) for x in data]      # the very objects, not copies sent over
    assert all(pid != parent for _, _, pid in out)
    assert len({pid for _, _, pid in out}) <= 2


def test_one_worker_runs_in_process():
    parent = os.getpid()
    out = fork_map(lambda a, b: [os.getpid()] * (b - a), 10, workers=1, chunk=3)
    assert out == [parent] * 10
    assert spans(10, 3) == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert list(fork_map_iter(lambda a, b: [], 0, workers=2)) == []


def test_worker_error_is_raised_in_the_parent():
    def job(a, b):
        if a <= 13 < b:
            raise ValueError("item 13 is bad")
        return list(range(a, b))
    with pytest.raises(ValueError, match="item 13 is bad"):
        fork_map(job, 30, workers=2, chunk=5)
