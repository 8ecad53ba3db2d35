"""What a Keras fit under a multi-worker strategy promises, computed in one plain process: the
reference the tf.distribute tests compare the workers' weights with (tests/test_tf_distribute.py,
tests/test_distributors.py)."""

import numpy as np

# Each worker's own rows, seeded by its rank: the cells define it on the ranks, the reference here.
WORKER_DATA = """\
def worker_data(rank, rows=64):
    import numpy as np
    x = np.random.default_rng(rank).normal(size=(rows, 4)).astype("float32")
    return x, (x.sum(axis=1, keepdims=True) > 0).astype("float32")
"""
_here = {}
exec(WORKER_DATA, _here)
worker_data = _here["worker_data"]


def one_process_on_the_global_batches(start, workers=2, steps=4, batch=16, lr=0.5):
    """The weights of the cells' model (Dense(1, sigmoid), binary cross-entropy, SGD(lr): a
    logistic regression) fitted from `start` on the global batches, by one process. Under the
    strategy a dataset's batch is the global one: a step takes batch // workers rows of each
    worker's own data, in order (a fit of 4 steps sees 32 of a worker's 64 rows). In float64:
    a Keras fit in one process gets the same to 1e-7."""
    kernel, bias = (np.array(w, dtype=np.float64) for w in start)
    rows = batch // workers
    data = [worker_data(rank) for rank in range(workers)]
    for step in range(steps):
        x = np.concatenate([x[step * rows:(step + 1) * rows] for x, _ in data])
        y = np.concatenate([y[step * rows:(step + 1) * rows] for _, y in data])
        error = (1 / (1 + np.exp(-(x @ kernel + bias))) - y) / len(x)  # d(mean loss)/d(logit)
        kernel = kernel - lr * x.T @ error
        bias = bias - lr * error.sum(axis=0)
    return [kernel, bias]


def assert_fitted_as_one_process(start, every_workers_weights):
    """Each worker's weights moved from `start` (the first worker's before the fit) to where one
    process fitting the global batches gets them: the workers' gradients were reduced."""
    expected = one_process_on_the_global_batches(start)
    for rank, weights in enumerate(every_workers_weights):
        assert len(weights) == 2
        moved = [np.abs(np.array(w) - np.array(s)).max() for w, s in zip(weights, start)]
        assert max(moved) > 1e-3, f"worker {rank}'s fit left its weights where they started"
        for w, e in zip(weights, expected):
            np.testing.assert_allclose(np.array(w), e, rtol=1e-4, atol=1e-5,
                                       err_msg=f"worker {rank} against one process")
    alone = one_process_on_the_global_batches(start, workers=1)  # worker 0's rows only: not it
    assert not np.allclose(np.array(every_workers_weights[0][0]), alone[0], atol=1e-3)
