"""The ways in: what a person types or calls, each a thin shell over the plain API (`hvd_magic.api`).

- `magics`: ``%%horovod``, ``%horovod_timeline``, ``%horovod_env``, ``%horovod_session``,
  ``%horovod_tensorboard``; `options` parses and checks their option values;
- `cells`: a ``%%horovod`` cell's options to a run, on fresh ranks or in the active warm session;
- `session_magic`, `tensorboard_magic`: the session and TensorBoard magics' bodies;
- `horovod_runner`: Databricks' ``HorovodRunner(np).run(main, **kwargs)``;
- `distributors`: pyspark's ``TorchDistributor`` and spark-tensorflow-distributor's
  ``MirroredStrategyRunner``, the same way;
- `script`: ``%horovod --np N train.py args`` and ``run_script``: a training script's job;
- `terminal`: ``python -m hvd_magic`` / ``hvd-run``, the same from a terminal;
- `data_magic`: ``%horovod_data``, the cache of converted ``--data`` DataFrames;
- `env_magic`: ``%horovod_env``, the executors' packages beside the driver's.

Nothing below this room imports it: the API, the driver, the launchers and the ranks know nothing
of IPython's magics.
"""
