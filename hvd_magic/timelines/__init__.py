"""Horovod timelines: recorded on rank 0, brought back, repaired, summarised and drawn.

- `record`: ``with hvd_magic.timeline():`` on a rank (a window of a run);
- `trace`: repair the file that came back into valid JSON, read it as spans per tensor;
- `summary`: tables of the top tensors and operations (``%horovod_timeline --summary``);
- `picture`: an SVG with a lane per tensor;
- `show`: what the notebook shows (the dashboard's panel, the text note, ``%horovod_timeline``).
"""
