"""How a run ended: the ranks' values in rank order, or the one error the user should read.

The first real failure wins (a rank's own exception, a crash, a task that died); the follow-on
errors it caused on the other ranks (`HorovodInternalError`, broken pipes) are summarised in one
line each. `finish` ends a run with one or the other, whatever happens: what the ranks sent
back is read by `hvd_magic.driver.results`, and what cannot be read ends the run with an error too.
"""

import re
import time

from .apply import ended_state
from .postmortem import attach
from .ranks import LIVE_STATES
from .results import collect, on_cpu_message, timeline_of, unreadable_error
from ..needs import RANKS_HERE, missing_message, missing_module
from ..errors import (LaunchError, RankError, RunCancelled, RunStalled, RunTimeout, describe_end,
                      is_follow_on, is_memory_loss)


def finish(run, internal=None):
    """End `run`, every rank ended: what the ranks sent read (`hvd_magic.driver.results`), each
    rank's final state, the run's values or its one error (`internal`: a bug of ours that
    stopped it), its state, ``run.json``, the view finished."""
    got = collect(run.launcher.outcomes or [], run.np, run.cell is not None)
    if got.on_cpu:  # said once, before the folder closes: in events.jsonl too
        _notice(run, {"t": "values", "message": on_cpu_message(got.on_cpu)})
    run.folder.close()
    run.timeline_path, unread = timeline_of(run)
    if run.profile and run.timeline_path is None and not unread:  # (--timeline, no step in it)
        from ..timelines.ranks import nothing_recorded
        _notice(run, {"t": "note", "message": nothing_recorded(run.profile, run.run_dir, run.np)})
    ok_ranks = {rank for rank, status, _ in run.launcher.outcomes or () if status == "ok"}
    for state in run.ranks:  # the final state from the outcomes, if no exit event came
        if state.rank in ok_ranks:
            state.state = "done"
        elif state.rank in got.infos:  # (a bystander's failure may have come before the cause)
            state.state = ended_state(run, got.infos[state.rank]["status"], got.infos[state.rank])
    results = got.results
    if run.elastic is not None:  # the survivors' values: lost ranks have none
        results = run.elastic.survivors(results, ok_ranks)
    run.exports, run.ended = got.exports, time.time()
    run.error = internal or run_error(run, got.infos, got.retried)
    if run.error is None and not got.unreadable:
        run.results = results  # (also when only the timeline could not be read)
    run.error = run.error or unreadable_error(run, got.unreadable + unread)
    if run.error is None:
        run.state = "done"
        run.folder.write_meta(run)
        if run.view is not None:
            run.view.finish(run)
    else:
        end_failed(run, run.error, internal is not None)


def end_failed(run, error, internal=True):
    """End `run` with `error`: its state final, ranks still live said cancelled, ``run.json``,
    the view finished."""
    run.error, run.ended = error, run.ended or time.time()
    run.state = "failed" if internal else {
        "cancelled": "cancelled", "timeout": "timeout"}.get(run.stop_reason, "failed")
    for state in run.ranks:
        if state.state in LIVE_STATES:
            state.state = "cancelled"
    run.folder.write_meta(run)
    if run.view is not None:
        run.view.finish(run)


def _notice(run, event):
    """News of the whole run: in events.jsonl and in the view."""
    run.folder.record(event)
    if run.view is not None:
        run.view.event(run, None, event)


def offline_message(events):
    """Why a run was not shown live (its tasks ran offline), or None."""
    offline = next((e for e in events if e.get("t") == "offline"), None)
    if offline is None:
        return None
    return (f"This run was not shown live: the Spark executors could not reach this notebook at "
            f"{offline.get('address')} ({offline.get('why')}). Their logs and results came back "
            f"through Spark at the end. If this machine has an address they can reach, set "
            f"HVD_MAGIC_DRIVER_HOST to it.")


def run_error(run, infos, retried):
    """The error `run` ends with, or None when every rank finished."""
    failures = [dict(infos.get(f["rank"], {}), **{k: v for k, v in f.items() if v is not None})
                for f in run.failures]
    failures += [dict(i, rank=r) for r, i in sorted(infos.items())
                 if i["status"] not in ("stopped",) and r not in {f["rank"] for f in failures}]
    launcher = run.launcher
    if run.elastic is not None and run.elastic.error is not None:
        return run.elastic.error  # every rank lost, their state with them (membership.py)
    if run.elastic is not None and launcher.error is not None:
        # too few ranks left for too long: it names what was lost (the survivors' own errors,
        # such as a rendezvous that went away, follow from it)
        return launcher.error
    if run.retry is not None:
        return _retry_error(run)
    if run.stop_reason == "stalled":
        # (the message says where each rank was: every rank was stopped by it, not failed)
        return RunStalled({"rank": None, "type": "Stall", "message": run.stall}, run_id=run.id,
                          note=f"Every rank's whole stack: {run.run_dir}/stacks.txt")
    if run.stop_reason in ("timeout", "cancelled") and all(_of_the_stop(f) for f in failures):
        # ranks that failed only because the stop took their peers first (a rank in a
        # collective when its peer was stopped): the stop is the cause, as their rows say
        failures = []
    lost_task = _lost_task_error(run)
    if failures and lost_task is not None and not _lost_to_the_stop(run, failures) and \
            all(is_follow_on(f) or f.get("signal") == "SIGABRT" for f in failures):
        # a task died with its executor, and the others only failed because its rank was
        # gone (or Horovod aborted them: Gloo, or its rendezvous in task 0, lost a peer): the
        # dead task is the cause
        return lost_task
    if failures:
        return _first_failure(run, failures, infos)
    if retried is not None:
        return LaunchError(retried["message"])
    if run.stop_reason == "timeout":
        return RunTimeout(_timeout_message(run))
    if run.stop_reason == "cancelled":
        return RunCancelled(f"run {run.id} was cancelled; every rank was stopped.")
    if launcher.error is not None:
        return lost_task or launcher.error
    if not launcher.outcomes or (run.elastic is None and len(launcher.outcomes) != run.np):
        return LaunchError(f"run {run.id} ended without results from every rank.")
    return None


def _lost_to_the_stop(run, failures):
    """Whether the tasks were lost to the stop a rank's failure made: the job was cancelled
    here (Spark's error is then not ours) after a failure that came before any stop (a
    rank aborted as its host was cut off from the rendezvous: soak seed 10, round 132)."""
    return not isinstance(run.launcher.error, LaunchError) and \
        any(not f.get("after_stop", True) for f in failures)


def _of_the_stop(failure):
    """Whether a rank's failure in a stopped run came from the stop: a peer's words, or
    Horovod's abort once the stop had begun (its rendezvous, in task 0, or a peer was gone)."""
    return is_follow_on(failure) or (failure.get("after_stop") and
                                     failure.get("signal") == "SIGABRT")


def _first_failure(run, failures, infos):
    causes = [f for f in failures if not is_follow_on(f)]
    # A rank SIGKILLed (not by the stop: its ranks are "stopped", not failures) beside one whose
    # code raised: the killed one is the cause, whichever end arrived first. No peer's error
    # sends a SIGKILL, but a killed peer makes errors beyond the collectives' own words (a
    # DeepSpeed step's TypeError on gradients its killed peer never reduced). A rank that
    # Horovod aborted (SIGABRT: Gloo lost a peer inside a collective) beside one whose code
    # failed: the failing code is the cause.
    first = next((f for f in causes if f.get("signal") == "SIGKILL"), None) or \
        next((f for f in causes if f.get("signal") != "SIGABRT"), None) or \
        (causes or failures)[0]
    first = dict(infos.get(first["rank"], {}), **first)
    if not first.get("traceback"):
        # died without a Python traceback (a signal, os._exit): its last words instead
        tail = run.folder.log_tail(first["rank"])
        if tail:
            first["traceback"] = f"last lines of rank {first['rank']}'s log:\n{tail}"
    if first.get("signal") == "SIGABRT" and _looks_like_rendezvous(first.get("traceback", "")):
        first["hint"] = (
            f"Horovod aborted inside hvd.init(): the Gloo rendezvous failed (rendezvous "
            f"server {first.get('rendezvous', '?')}, on rank 0's host). Check that every rank "
            f"calls hvd.init(), that the executors can reach that address and each other "
            f"on interface {first.get('iface', '?')} (HOROVOD_GLOO_IFACE), and that "
            f"HOROVOD_GLOO_TIMEOUT_SECONDS covers the ranks' start-up.")
    elif first.get("signal") and _crashed_in_tf_profiler(first.get("traceback", "")):
        first["hint"] = (
            f"TensorFlow's profiler crashed rank {first['rank']} as it stopped (--timeline): a "
            "defect of TensorFlow's own (SIGSEGV in its TraceMeRecorder), seen here about once "
            "in 25 runs of a two-worker tf.distribute cell. Run the cell again, or without "
            "--timeline.")
    elif first.get("oom"):
        first["hint"] = (
            f"Rank {first['rank']} needed more memory than it had. Run fewer ranks a host "
            "(--np), a smaller batch or model, or give it more memory: on Spark, the executors' "
            "(spark.executor.memory, and the container's limit); on this machine, fewer ranks "
            "at once. Each rank's memory is in the dashboard and in run.resources.")
    elif first.get("type") in ("ModuleNotFoundError", "ImportError") and \
            (package := missing_module(first.get("message"))):
        # an optional package (Horovod, a framework) the rank's Python lacks: which, and how
        where = (RANKS_HERE if run.where == "driver only"
                 else f"the Python of the executor on {first.get('host') or '?'}")
        first["hint"] = missing_message(package, f"Rank {first['rank']}'s code", where=where,
                                        python=first.get("python") or None)
    elif first.get("type") in ("ModuleNotFoundError", "ImportError") and run.where != "driver only":
        # The commonest first failure on a real cluster: a package the driver has and the
        # executors lack (or have in another version).
        first["hint"] = (f"Rank {first['rank']} ran on an executor whose Python could not import "
                         "what the driver can: %horovod_env compares the executors' packages "
                         "with the driver's.")
    others = {}
    for rank in range(run.np):
        if rank == first["rank"]:
            continue
        if run.ranks[rank].state == "stopped":  # a bystander, in every view's word
            others[rank] = "stopped"
        elif rank in infos:
            others[rank] = describe_end(infos[rank])
        elif run.ranks[rank].state == "done":
            others[rank] = "finished"
    return attach(RankError(first, others, run_id=run.id))  # its frames, for %debug


SILENT = 15.0  # seconds without a word from a task that say its host could not be reached


def _lost_task_error(run):
    """A LaunchError naming the rank whose Spark task died without a word, if one did."""
    error = run.launcher.error
    if error is None or not run.launcher.error_loses_ranks:
        return None
    if not isinstance(error, LaunchError):  # the job cancelled by the driver's last resort
        # (the other ranks were slow to stop): its first line, never a Java stack trace
        error = (str(error).strip().splitlines() or [type(error).__name__])[0]
    lost = run.unended()
    failed = re.search(r"barrier task ResultTask\(\d+, (\d+)\)", str(error))
    if not lost and failed:
        # Every rank had an end: the failed task's rank was stopped with the others before its
        # own end was heard (a rank forked from a template outlives its task until the
        # template sees the task gone). Spark's word names it.
        lost = [r for r in run.ranks
                if r.partition == int(failed.group(1)) and r.state != "done"]
    # the task Spark names as the failed one, else the first without an ending
    lost.sort(key=lambda r: r.partition != (int(failed.group(1)) if failed else None))
    if not lost:
        return None
    r = lost[0]
    if is_memory_loss(str(error)):
        return LaunchError(
            f"the executor of rank {r.rank} on {r.host} (executor {r.executor}) ran out of "
            f"memory, and Spark lost it with its task; every other rank was stopped. Give the "
            f"executors more memory (spark.executor.memory, spark.executor.memoryOverhead: a "
            f"rank is a Python process beside the executor's JVM), or run fewer ranks an "
            f"executor. [{error}]")
    # (a task sends its rank's usage every second: a long silence is its host's, not its own)
    silent = time.monotonic() - r.last_event if r.pid is not None else 0  # (heard from once)
    why = (f"nothing was heard from its host for {silent:.0f} s before: it was cut off from the "
           f"driver's network, or frozen" if silent > SILENT else
           "its Python worker or executor was killed")
    return LaunchError(
        f"the Spark task of rank {r.rank} on {r.host} (executor {r.executor}) died "
        f"before its rank ended ({why}); every other rank was stopped. Spark aborts a barrier "
        f"stage whose task fails and hvd_magic does not re-attempt it, so training was not "
        f"started over. "
        f"[{error}]")


def _retry_error(run):
    earlier = run.retry["earlier"]
    if earlier:
        first = next((f for f in earlier if not is_follow_on(f)), earlier[0])
        cause = f"rank {first['rank']} {describe_end(first)}"
    else:
        lost = [r.rank for r in run.ranks if r.exit is None]
        cause = (f"the task of rank {lost[0] if lost else run.retry['rank']} died (its Python "
                 "worker or executor exited)")
    return LaunchError(
        f"Spark re-attempted the barrier stage after a failure ({cause}); hvd_magic stopped "
        "the new attempt rather than start training over silently. Fix the failure, or pass "
        "--retries N to allow re-attempts.")


def _timeout_message(run):
    lines = [f"run {run.id} reached its --timeout of {run.timeout:g} s; every rank was stopped."]
    for r in run.ranks:
        progress = f" step {r.step}/{r.total}" if r.step is not None else ""
        last = f" last line: {r.last_line.strip()}" if r.last_line.strip() else " nothing printed"
        lines.append(f"  rank {r.rank}:{progress}{last}")
    if getattr(run, "last_stacks", None) is not None:  # taken as the timeout stopped the run (driver/loop.py)
        lines += ["Where each rank was:", run.last_stacks.text(),
                  f"Every rank's whole stack: {run.run_dir}/stacks.txt"]
    return "\n".join(lines)


def _looks_like_rendezvous(text):
    return any(word in text for word in ("gloo", "Gloo", "rendezvous", "HTTPStore", "Timed out",
                                         "HTTP request failed"))  # (its client's last words)


def _crashed_in_tf_profiler(text):
    """Whether a rank's last words (Python's faulthandler: the crashed thread's frames, innermost
    first) end inside TensorFlow's ``profiler.experimental.stop``."""
    crashed = text.partition("Current thread")[2].splitlines()[1:2]
    return bool(crashed) and "/tensorflow/python/profiler/" in crashed[0] and \
        crashed[0].rstrip().endswith(" in stop")
