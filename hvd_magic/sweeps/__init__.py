"""Sweeps: several trials of one function or cell, run as gangs that share the slots, compared
live, stopped early on every rank at the same step.

- `space`: the trials' values (a grid, random draws);
- `options`: `SweepOptions`, what a person asked, checked once;
- `slots`: the slots the trials share, held all or nothing;
- `trial`: a trial, its run's view, and the early-stop agreement on a step;
- `stopping`: median stopping and ASHA;
- `runner`: `Sweep`, the scheduler of the gangs, its table and best trial;
- `api`: `hvd_magic.sweep(...)`, the ``--sweep`` cell, `last_sweep()`;
- `view`: the sweep's view (a widget table and chart, or text).
"""
