"""Survivors of a rank killed inside a collective: how often one of them is lost too.

Each round starts a warm elastic session of 3 ranks with ``--min-np 2`` (driver-only and on the
embedded Spark session, alternately), runs ``hvd.allreduce`` in a loop in a background cell,
SIGKILLs rank 1 after a delay that varies with the round (0 to 0.3 s), and counts the round good
when the session says it goes on with 2 ranks and its next cell's allreduce sums to 2 on both
survivors. A round that is not good is printed with the session's message: a survivor lost as
well (SIGABRT: Horovod 0.28.1's background loop, going on after a collective that failed, sent
its next negotiation to a survivor still inside that collective, and Gloo aborted it; our
``elastic-stop`` patch to the build ends the loop there).

    .venv/bin/python bench/bench_survivors.py [--rounds 30] [--json PATH]

Run several at once for the load under which it shows (3 at once: 3 rounds of 90 lost a
survivor with the unpatched loop). Not a test: a rate, over many rounds.
"""

import argparse
import os
import signal
import time

from rows import row, write

LOOP = "import time\nprint('training', flush=True)\nwhile True:\n    hvd.allreduce(torch.tensor([1.0]))\n"


def one_round(ip, magics, i):
    """The session's message, and whether the survivors went on."""
    import hvd_magic

    ip.run_line_magic("horovod_session", f"start --np {3 if i % 2 else -3} --min-np 2")
    session = magics.session
    try:
        pids = [session.ranks[r]["pid"] for r in range(session.np)]
        ip.run_cell_magic("horovod", "--quiet", "import torch, horovod.torch as hvd\nhvd.init()")
        run = ip.run_cell_magic("horovod", "--quiet --background", LOOP)
        deadline = time.monotonic() + 60
        while not all(r.lines for r in run.ranks) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.05 * (i % 7))
        os.kill(pids[1], signal.SIGKILL)
        try:
            run.wait(45)
            return "the cell ended without an error", False
        except hvd_magic.LaunchError as exc:
            message = str(exc)
        if "the session goes on with 2 ranks" not in message:
            return message, False
        ip.run_cell_magic("horovod", "--quiet",
                          "hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum).item()")
        return message, sorted(hvd_magic.last_run().results) == [2.0, 2.0]
    finally:
        ip.run_line_magic("horovod_session", "stop")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--json", help="write the row here")
    args = parser.parse_args()
    os.environ["HVD_MAGIC_NO_WIDGETS"] = "1"
    from IPython.testing.globalipapp import start_ipython

    ip = start_ipython()
    ip.run_line_magic("load_ext", "hvd_magic")
    magics = ip.magics_manager.registry["HorovodMagics"]
    lost = []  # per round: 1 where a survivor was lost too
    for i in range(args.rounds):
        message, good = one_round(ip, magics, i)
        lost.append(0 if good else 1)
        if not good:
            print(f"round {i}: {message}", flush=True)
    print(f"{sum(lost)} of {args.rounds} rounds lost a survivor")
    write(args.json, [row("survivors", "rank 1 killed inside allreduce", 3, lost,
                          unit="rounds lost a survivor", rounds=args.rounds,
                          survivors_lost=sum(lost))])


if __name__ == "__main__":
    main()
