"""``%horovod_data``: the data cache of ``--data`` (`hvd_magic.data.cache`), listed,
sized and cleared from the notebook. A thin shell: the cache's own functions do the work."""

import datetime

from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from ..data import cache as datacache
from .options import summary_first


@summary_first
@magic_arguments()
@argument("action", nargs="?", default="list", choices=("list", "clear"),
          help="list (the default): each converted DataFrame, its size and age; clear: remove "
               "them (one with --entry).")
@argument("--entry", type=str, default=None,
          help="With clear: only this entry (a name from the list).")
def horovod_data(magics, line):
    """The DataFrames ``--data`` converted once (those that are not plain Parquet scans), kept in
    ``HorovodMagics.data_cache`` (default ``~/.cache/hvd_magic/data``) for later cells and runs.

    Examples
    --------
    ::

        %horovod_data                 # list: entry, MB, files, created
        %horovod_data clear           # remove every entry
        %horovod_data clear --entry 3f2a9c...
    """
    args = parse_argstring(horovod_data, line)
    directory = datacache.cache_dir(magics.data_cache or None, local=True)
    if args.action == "clear":
        removed = datacache.clear(directory, args.entry)
        print(f"removed {removed} entr{'y' if removed == 1 else 'ies'} from {directory}")
        return None
    rows = datacache.entries(directory)
    if not rows:
        print(f"no converted DataFrame in {directory}")
        return None
    print(f"{len(rows)} converted DataFrame{'s' if len(rows) > 1 else ''} in {directory}, "
          f"{sum(r[1] for r in rows):,.1f} MB:")
    for name, mb, files, created in rows:
        when = datetime.datetime.fromtimestamp(created).strftime("%Y-%m-%d %H:%M")
        print(f"  {name}  {mb:10,.1f} MB  {files:4d} files  {when}")
    return None
