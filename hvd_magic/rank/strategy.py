"""What `MirroredStrategyRunner` runs on each rank when it makes the strategy itself: a
``tf.distribute.MultiWorkerMirroredStrategy`` first (TensorFlow's first op in the process, as
collective ops require), then the user's function inside its scope.

Module level so the function pickles by reference: ranks import this small module, not the
notebook-side runner (which needs IPython). TensorFlow is imported here only when it runs.
"""


def in_mirrored_strategy(fn, kwargs):
    """``fn(**kwargs)`` inside a new `MultiWorkerMirroredStrategy`'s scope (the rank's
    ``TF_CONFIG`` names every rank); its value."""
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        return fn(**kwargs)
