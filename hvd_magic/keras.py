"""`MetricsCallback`: a Keras callback that feeds the dashboard's live charts, on a rank.

    model.fit(x, y, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                               hvd_magic.keras.MetricsCallback()])

Each epoch's logs (loss, accuracy, val_*...) are reported with the epoch as the step (and the
number of epochs as the total, for the progress bar); with ``every_n_batches=N`` the training
batches' logs are reported too, every N batches, as ``<metric> (batch)`` against the batch count.
It is a callback to add, not something hvd_magic slips into ``fit``: ``model.fit`` stays what the
user wrote, and a rank without hvd_magic (plain ``horovodrun``) runs the same code with the
callback doing nothing.

Keras is imported when the callback is made, and it is the Keras the rank gives ``import keras``
(Keras 2 by default, see `hvd_magic.rank.keras_alias`), so it fits the user's model.
"""

from .rank.reporting import report


def _numbers(logs, suffix=""):
    out = {}
    for name, value in (logs or {}).items():
        try:
            out[f"{name}{suffix}"] = float(value)
        except (TypeError, ValueError):
            pass  # a non-numeric log entry (e.g. a learning-rate schedule object)
    return out


def MetricsCallback(every_n_batches=None):
    """A ``keras.callbacks.Callback`` that reports each epoch's (and every N batches') logs."""
    import keras

    class _MetricsCallback(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.batches = 0

        def on_train_batch_end(self, batch, logs=None):
            self.batches += 1
            if every_n_batches and self.batches % every_n_batches == 0:
                report(step=self.batches, **_numbers(logs, " (batch)"))

        def on_epoch_end(self, epoch, logs=None):
            report(step=epoch + 1, total=self.params.get("epochs"), **_numbers(logs))

    return _MetricsCallback()
