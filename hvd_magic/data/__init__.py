"""The driver's side of ``--data``: a Spark DataFrame checked and planned for the ranks.

- `frames`: the DataFrame checked, and its plan (read directly, or converted once)
- `parquet`: whether a DataFrame is a plain Parquet scan, and its files, columns and filter
- `plan`: the plan every rank reads its rows by (row groups, each rank's row range)
- `cache`: DataFrames written once by Spark into the data cache, listed and cleared

The ranks' side is `hvd_magic.rank.stream` and `hvd_magic.rank.data`; the launchers call
`frames.check_data` and `frames.data_plan` and know nothing else of this room.
"""
