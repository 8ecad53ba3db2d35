"""What comes back: the driver side of a run.

- `run`: `Run`, the user's handle on one launch (results, state, wait, cancel) and its start;
- `loop`: the driver loop turning the tasks' events into per-rank state, logs and view updates;
- `ranks`: `RankState`, what the driver knows of one rank;
- `folder`: the run folder on disk (every rank's full log, ``run.json``, files sent back);
- `watchdog`: the hang watchdog (ranks waiting in a collective while others ended);
- `ending`: the ranks' values and the one error a run ends with;
- `history`: every run of this process (`runs`, `last_run`).
"""
