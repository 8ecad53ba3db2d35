"""Timelines: Horovod's, recorded on rank 0, brought back, repaired, summarised and drawn; and
every rank's torch profile (``--timeline`` of torch code without Horovod), merged and read.

- `record`: ``with hvd_magic.timeline():`` on a rank (a window of a run);
- `trace`: repair the file that came back into valid JSON, read it as spans per tensor;
- `summary`: tables of the top tensors and operations (``%horovod_timeline --summary``);
- `picture`: an SVG with a lane per tensor;
- `ranks`: the ranks' torch profiles, clocks aligned, merged, read (steps, collectives, waits);
- `ranks_picture`: a lane per rank, and the table per step and rank;
- `show`: what the notebook shows (the dashboard's panel, the text note, ``%horovod_timeline``).
"""
