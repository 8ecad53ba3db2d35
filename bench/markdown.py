"""BENCHMARKS.md from the record `bench/run_all.py` keeps (BENCHMARKS.json): rows in, markdown out.

Every table is built from the rows of `bench/rows.py` alone, so a new benchmark that writes
rows gets its section with no code here; only the targets at the top know row names.

Not for: running or timing anything.
"""

STANDARD = {"bench", "name", "np", "median", "best", "ratio", "unit", "better", "values",
            "reference", "column", "loads", "reps", "skipped", "error", "absent"}

TITLES = {
    "launch": "Launch: a trivial cell (`hvd.init()` + one allreduce), wall seconds of the call",
    "launch-4hosts": "Launch across 4 simulated hosts (network namespaces, a standalone worker "
                     "of 4 slots each): the trivial cell, wall seconds of the call",
    "launch-profile": "Where a launch goes (np=2, seconds since the call)",
    "launch-spark-start": "The embedded Spark session's start (once, before the timings)",
    "training": "Training throughput, PyTorch: rank 0's steps/s",
    "training-keras": "Training throughput, Keras: rank 0's steps/s",
    "threads": "CPU threads per rank: a small CNN's img/s (Horovod's synthetic benchmark's total), "
               "default threads",
    "timeline": "Timeline cost: steps/s with Horovod's timeline off, DYNAMIC, full",
    "logs": "Log cost: a rank's print loop, and lines lost",
    "payload": "Payload: call → the cell began on rank 0, for a value of each size",
    "session": "Warm session round trip beside ipyparallel `%%px`",
    "report": "`hvd_magic.report()` per call (ratio: share of a 5 ms step)",
    "resources-cost": "Every rank's resources sampled each second: rank 0's steps/s (np -2), with "
                      "it and without (HVD_MAGIC_NO_RESOURCES=1)",
    "first-cell": "The first `%%horovod --np 2` cell of a new kernel, wall seconds",
    "timeline-ranks": "`--timeline` of a DDP cell (every rank's torch profile, merged): step "
                      "time with it and without (ratio: to without), merging, drawing",
    "timeline-ranks-files": "`--timeline` of a DDP cell: the files (2 ranks, 5 steps, a "
                            "three-layer MLP)",
    "timeline-ranks-tf": "`--timeline` of a tf.distribute Keras fit (every worker's TensorFlow "
                         "profile, merged): step time with it and without (ratio: to without), "
                         "merging, drawing",
    "timeline-ranks-tf-files": "`--timeline` of a tf.distribute Keras fit: the files (2 workers, "
                               "5 steps, a three-layer MLP)",
    "shipping": "A cell importing pandas on a standalone cluster (np 4) whose executors lack "
                "hvd_magic, pandas and its requirements (sent: first run unpacks them) beside "
                "executors that have them installed (ratio: to installed, the same run)",
    "install": "`pip install` of the wheel into a user's environment, seconds (np: not a run)",
    "reinit": "hvd.init()/shutdown cycles under load; hvd.init() skew",
    "sweeps": "A sweep (`hvd_magic.sweep`, np -2): 8 trials of 20 steps of 0.1 s, 2 at once, "
              "beside the same trials one after another (a loop of `hvd_magic.run`) and the "
              "ideal (the trials' own run times / 2); a trial's end to the next one's first "
              "step; an early stop's decision to every rank's exit; beside them the same sweep "
              "under Ray Tune with TorchTrainer (`--ray PYTHON`), Ray's start-up apart",
    "shards": "`--data`: Parquet read directly, converted, beside Spark's Arrow stage and `toPandas()`",
    "shards-stream": "`--data`: a shard 4× a rank's RSS budget streamed twice (RSS growth, MB)",
    "scripts": "Training scripts and MLflow: logging cost per point (ratio: share of a 5 ms step); "
               "`%horovod script.py` launch beside the same code in a cell",
    "elastic": "Elastic recovery: kill → first step after it, steps redone (np 3, --min-np 2)",
    "ddp-train": "DDP training throughput (torch.distributed, Gloo): rank 0's steps/s",
    "deepspeed-train": "DeepSpeed ZeRO-2 training throughput (CPU, Gloo): rank 0's steps/s",
    "deepspeed-turns": "DeepSpeed ZeRO-2 in turns: every launcher's ranks alive at once, taking "
                       "turns of 50 steps; rank 0's steps/s (ratio: the median of each turn "
                       "over the torchrun turns beside it)",
    "jax-psum": "JAX: a 4 MiB all-reduce across two processes (Gloo), rank 0's ms per call",
    "deepspeed-first-run": "The first DeepSpeed run (`init_distributed()` on --np -2): wall "
                           "seconds with an empty op folder (compiling) and the host's, warm",
    "ddp-launch": "Launch of a trivial DDP cell (`init_process_group` + one all_reduce), wall "
                  "seconds of the call",
    "elastic-cost": "Elastic cost when nothing fails: rank 0's steps/s (np -3, and np 3 on Spark)",
    "stacks": "Time to every rank's Python stack (`run.stacks()`), the last rank free or holding "
              "the GIL; `sim-`: ranks without torch or Horovod, real probes",
    "stacks-cost": "The stacks machinery unused: rank 0's steps/s (np -2), with it and without "
                   "(HVD_MAGIC_NO_PROBE=1)",
}
REFERENCES = {
    "stacks-cost": "the ranks without it",
    "resources-cost": "the ranks not sampled",
    "launch": "the floor (N bare rank processes rendezvousing directly)",
    "launch-4hosts": "the floor (on one host)",
    "training": "`horovodrun` on the same script", "training-keras": "`horovodrun` on the same script",
    "threads": "`horovodrun --gloo` on the same script (torch's default threads)",
    "timeline": "no timeline", "logs": "the same loop printing to /dev/null",
    "payload": "the 8-byte value", "session": "`%%px`", "sweeps": "the ideal",
    "elastic": "`horovodrun --min-np` with a discovery script, same loop and kill",
    "ddp-train": "`torchrun --nproc_per_node N` on the same step",
    "deepspeed-train": "`torchrun --nproc_per_node N` on the same steps (same op folder, warm)",
    "deepspeed-turns": "torchrun's turns, the one before and the one after",
    "jax-psum": "two processes started by hand, `initialize(address, 2, rank)`",
    "deepspeed-first-run": "the same call with the host's op folder, warm",
    "ddp-launch": "the floor (N bare processes running the trivial Horovod cell)",
    "elastic-cost": "a barrier run of the same step in a plain loop, in the same place",
}


def fmt(value, unit="s"):
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int):
        return str(value)
    if unit == "s" and 0 < abs(value) < 0.01:
        return f"{value * 1e6:.1f} µs" if abs(value) < 1e-3 else f"{value * 1e3:.2f} ms"
    if abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.2f}"


def _cell(r, key="median"):
    if r is None or r.get(key) is None:
        return "–"
    text = fmt(r[key], r.get("unit", "s"))
    ratio = r.get("ratio") if key == "median" else r.get("best_ratio")
    if ratio is None:
        return text
    return f"{text} ({ratio:.2f}×)" if ratio >= 0.01 else f"{text} ({ratio:.2g}×)"


def _with_best_ratios(rows):
    """Each row's best over its reference row's best (same bench and np), where there is one."""
    refs = {(r["np"], r["name"]): r for r in rows}
    for r in rows:
        ref = refs.get((r["np"], r.get("reference")))
        if ref and ref.get("best") and r.get("best") is not None:
            r["best_ratio"] = r["best"] / ref["best"]
    return rows


def pivot(rows, key="median", across="np"):
    names = list(dict.fromkeys(r["name"] for r in rows))
    cols = list(dict.fromkeys(r.get(across) for r in rows))
    by = {(r["name"], r.get(across)): r for r in rows}
    label = (lambda c: f"np={c}") if across == "np" else str
    out = ["| | " + " | ".join(label(c) for c in cols) + " |", "|---|" + "---:|" * len(cols)]
    for name in names:
        out.append(f"| {name} | " + " | ".join(_cell(by.get((name, c)), key) for c in cols) + " |")
    return out


def details(rows):
    """The rows' own extra fields, one line per row."""
    extras = [k for k in dict.fromkeys(k for r in rows for k in r)
              if k not in STANDARD and k != "best_ratio"
              and all(not isinstance(r.get(k), (list, dict)) for r in rows)]
    if not extras:
        return []
    out = ["| name | np | " + " | ".join(extras) + " |", "|---|---:|" + "---:|" * len(extras)]
    for r in rows:
        if all(r.get(k) is None for k in extras):  # nothing of its own to say
            continue
        out.append(f"| {r['name']} | {fmt(r.get('np'))} | "
                   + " | ".join(fmt(r.get(k), "s" if k in ("extra", "driver", "cell") else "")
                                for k in extras) + " |")
    return out


def section(bench, rows):
    absent = [r for r in rows if r.get("absent")]
    rows = [r for r in _with_best_ratios(rows) if r.get("median") is not None or r.get("error")]
    errors = [r for r in rows if r.get("error")]
    rows = [r for r in rows if r.get("median") is not None]
    out = []
    if bench == "launch-profile":
        return pivot(rows, across="column")
    unit, better = rows[0].get("unit", "s") if rows else "s", rows[0].get("better") if rows else None
    reps = rows[0].get("reps") if rows else None
    note = f"Median of {reps} interleaved repetitions" if reps else "Median"
    if bench in REFERENCES:
        note += f"; in brackets the ratio to {REFERENCES[bench]}"
    out += [f"{note} ({unit}, {better or 'lower'} is better).", "", *pivot(rows)]
    if any(r.get("best") != r.get("median") for r in rows):
        out += ["", "Best of the repetitions (load on a shared machine only ever makes a run slower: "
                    "the best is the steadier estimate of the cost):", "",
                *pivot(rows, key="best")]
    extra = details(rows)
    if extra:
        out += ["", *extra]
    if absent:
        out += ["", "Not measured: " + "; ".join(f"{r['name']}: {r['absent']}" for r in absent)]
    if errors:
        out += ["", "Failures: " + "; ".join(f"{r['name']}: {str(r['error'])[:200]}" for r in errors)]
    return out


def _rows(record, bench):
    return [r for b in record["benchmarks"].values() for r in b.get("rows", [])
            if r.get("bench") == bench and r.get("median") is not None]


def targets(record):
    out = ["| target | measured (median; best in brackets) | met? |", "|---|---|---|"]

    def line(target, measured, ok):
        out.append(f"| {target} | {measured} | "
                   f"{'yes' if ok else '**no**' if ok is not None else '–'} |")

    launch = _with_best_ratios(_rows(record, "launch"))
    for name in ("hvd_magic-spark", "hvd_magic-driver"):
        mine = [r for r in launch if r["name"] == name and r.get("ratio") is not None]
        if mine:
            line(f"{name} launch ≤ 1.2× the floor",
                 ", ".join(f"np={r['np']}: {r['ratio']:.2f}× ({r.get('best_ratio', 0):.2f}×)"
                           for r in mine), all(r["ratio"] <= 1.2 for r in mine))
        for rival in ("horovodrun", "TD-barrier"):
            theirs = {r["np"]: r for r in launch if r["name"] == rival}
            pairs = [(r, theirs[r["np"]]) for r in mine if r["np"] in theirs]
            if pairs:
                line(f"{name} faster than {rival}",
                     ", ".join(f"np={a['np']}: {a['median']:.2f} vs {b['median']:.2f} s"
                               for a, b in pairs), all(a["median"] < b["median"] for a, b in pairs))
    for bench, framework in (("training", "PyTorch"), ("training-keras", "Keras")):
        rows = _with_best_ratios(_rows(record, bench))
        for name in ("hvd_magic-spark", "hvd_magic-driver"):
            mine = [r for r in rows if r["name"] == name and r.get("ratio") is not None]
            if mine:
                line(f"{name} training ≥ 1.0× horovodrun ({framework})",
                     ", ".join(f"np={r['np']}: {r['ratio']:.2f}× ({r.get('best_ratio', 0):.2f}×)"
                               for r in mine), all(r["ratio"] >= 1.0 for r in mine))
    threads = _with_best_ratios(_rows(record, "threads"))
    for name in ("hvd-run-spark", "hvd-run-driver"):
        mine = [r for r in threads if r["name"] == name and r.get("ratio") is not None]
        if mine:  # ranks × every core > the cores from np 2 on; np 1: never slower
            line(f"{name} CNN img/s ≥ 1.5× horovodrun at np ≥ 2, ≥ 1.0× at np 1 (default threads)",
                 ", ".join(f"np={r['np']}: {r['ratio']:.2f}× ({r.get('best_ratio', 0):.2f}×)"
                           for r in mine),
                 all(r["ratio"] >= (1.5 if r["np"] > 1 else 1.0) for r in mine))
    for r in _rows(record, "payload"):
        if r["name"] != "8 B" and r.get("mb", 0) >= 200:
            line(f"a {r['name']} value ≤ 0.5 s over an 8-byte one (np={r['np']})",
                 f"+{r['extra']:.2f} s", r["extra"] <= 0.5)
    for r in _rows(record, "timeline"):
        if r["name"] != "off":
            line(f"timeline ({r['name']}) ≤ 5% cost", f"{r['ratio']:.2f}× the steps/s without one",
                 r["ratio"] >= 0.95)
    logs = [r for r in _rows(record, "logs") if "lost" in r]
    if logs:
        line("zero lines lost", ", ".join(f"{r['np']} rank(s): {r['lost']} lost" for r in logs),
             all(r["lost"] == 0 for r in logs))
    shards = {r["name"]: r for r in _rows(record, "shards")}
    if "shards" in shards:
        r = shards["shards"]
        floor = shards.get("spark-arrow")
        line(f"--data read directly ≥ 300 MB/s and ≥ 3× Spark's own Arrow stage ({r['mb']:.0f} MB "
             f"to np={r['np']})",
             f"{r['mb_per_s']:.0f} MB/s" + (f" ({r['mb_per_s'] / floor['mb_per_s']:.1f}× Spark's "
                                            f"{floor['mb_per_s']:.0f} MB/s)" if floor else ""),
             r["mb_per_s"] >= 300 and (floor is None or r["mb_per_s"] >= 3 * floor["mb_per_s"]))
        line("--data: the notebook's RSS flat (≤ 50 MB growth)",
             f"+{r['notebook_rss_growth_mb']:.0f} MB (toPandas: "
             f"+{shards['toPandas']['notebook_rss_growth_mb']:.0f} MB)"
             if "toPandas" in shards else f"+{r['notebook_rss_growth_mb']:.0f} MB",
             r["notebook_rss_growth_mb"] <= 50)
    if "converted" in shards:
        r = shards["converted"]
        line("a converted DataFrame's second use ≥ 1 GB/s", f"{r['mb_per_s']:.0f} MB/s",
             r["mb_per_s"] >= 1000)
    if "first-batch" in shards:
        r = shards["first-batch"]
        line("time to the first batch ≤ 1 s", f"{r['median']:.2f} s from the call", r["median"] <= 1)
    for r in _rows(record, "shards-stream"):
        line(f"a {r['shard_mb']:.0f} MB shard (4× a {r['budget_mb']} MB budget) streamed twice: "
             f"rank RSS ≤ baseline + {r['budget_mb']} MB", f"+{r['median']:.0f} MB",
             r["median"] <= r["budget_mb"])
    for r in _rows(record, "scripts"):
        if r["name"].endswith("per point"):
            line(f"MLflow logging < 1% of a 5 ms step ({r['name']})",
                 f"{r['median'] * 1e6:.1f} µs = {r['ratio'] * 100:.2f}%", r["ratio"] < 0.01)
        elif r["name"] == "%horovod script.py" and r.get("ratio") is not None:
            line("`%horovod --np 2 script.py` launch ≤ 1.05× the same code in a cell",
                 f"{r['median']:.2f} s, {r['ratio']:.3f}×", r["ratio"] <= 1.05)
    for r in _rows(record, "elastic"):
        if r.get("ratio") is not None:
            who = r["name"].split(", ", 1)[-1]
            line(f"elastic recovery ({who}) ≤ 1.0× `horovodrun --min-np`'s and ≤ 20 s",
                 f"{r['median']:.2f} s, {r['ratio']:.2f}× ({r['median'] / r['ratio']:.2f} s); "
                 f"steps redone: {', '.join(map(str, r.get('redone') or []))}",
                 r["ratio"] <= 1 and r["median"] <= 20)
    for r in _with_best_ratios(_rows(record, "elastic-cost")):
        if r["name"].startswith(("elastic", "Spark elastic")) and r.get("ratio") is not None:
            place = "on Spark " if r["name"].startswith("Spark") else ""
            line(f"an elastic run {place}with no failure (a commit every {r['commit_every']} steps) "
                 "costs ≤ 5% steps/s",
                 f"{r['ratio']:.2f}× a barrier run's steps/s ({r.get('best_ratio', 0):.2f}×; "
                 f"paired by repetition {r.get('paired_ratio', 0):.2f}×)",
                 r["ratio"] >= 0.95)
    for r in _rows(record, "sweeps"):
        if r.get("over_serial") is not None:
            line(f"a sweep ({r['name']}) ≥ 0.9× the ideal",
                 f"{r['ideal_over_sweep']:.2f}× ({r['median']:.2f} s; the same trials one "
                 f"after another take {1 / r['over_serial']:.2f}× as long)",
                 r["ideal_over_sweep"] >= 0.9)
        elif r.get("over_hvd_magic") is not None:
            line(f"the same sweep under {r['name'].split(',')[0]} (Ray {r.get('ray')})",
                 f"{r['median']:.2f} s, {r['over_hvd_magic']:.2f}× hvd_magic's sweep "
                 f"({r['ideal_over_sweep']:.2f}× the ideal)", None)
    for bench, target, ok in (("deepspeed-train", "DeepSpeed ZeRO-2 steps/s ≥ 0.95× torchrun "
                               "(whole runs, one after another)", lambda ratio: ratio >= 0.95),
                              ("deepspeed-turns", "DeepSpeed ZeRO-2 steps/s ≥ 0.95× torchrun, "
                               "in turns (every turn beside torchrun's)",
                               lambda ratio: ratio >= 0.95),
                              ("jax-psum", "JAX psum rate ≥ 0.95× two processes by hand (ms ≤ "
                               "1.05×)", lambda ratio: ratio <= 1 / 0.95)):
        mine = [r for r in _rows(record, bench) if r["name"].startswith("hvd_magic")
                and r.get("ratio") is not None]
        if mine:
            line(target, ", ".join(f"{r['name']} np={r['np']}: {r['ratio']:.2f}×" for r in mine),
                 all(ok(r["ratio"]) for r in mine))
    for r in _rows(record, "session"):
        if r["name"].startswith("%%horovod"):
            line(f"{r['name']} round trip vs `%%px`",
                 f"np={r['np']}: {r['median'] * 1e3:.1f} vs {r['median'] / r['ratio'] * 1e3:.1f} ms",
                 None)
    return out


def render(record, reading):
    benches = record["benchmarks"]
    minutes = sum(b.get("seconds", 0) for b in benches.values()) / 60
    loads = [record.get("load_before")] + [b.get("load_after") for b in benches.values()]
    out = ["# Benchmarks", "",
           f"Generated by `make bench` (`.venv/bin/python bench/run_all.py "
           f"{' '.join(record.get('argv', []))}`) on {record.get('started')}; {minutes:.0f} min in "
           "all; every row is also in BENCHMARKS.json (bench/rows.py says its shape). Timings live "
           "here, never in tests. Every comparison runs in one script, interleaved (the order "
           "rotates each repetition), and reports medians and best-of.", "",
           "**Machine**: " + "; ".join(f"{k} {v}" for k, v in record.get("machine", {}).items()) + ".",
           "", "**Load average** (1 min) before the run and after each benchmark: "
           + ", ".join(fmt(x) for x in loads if x is not None)
           + ". The machine is shared (other engineers run test suites on it), so single numbers "
           "are noisy; compare ratios within a table rather than across tables.", "",
           *targets(record), "", "<!-- reading -->",
           reading.strip() or "_(no reading written yet)_", "<!-- /reading -->", ""]
    for name, b in benches.items():
        by_bench = {}
        for r in b.get("rows", []):
            by_bench.setdefault(r.get("bench", name), []).append(r)
        out += [f"## {name}", ""]
        if b.get("missing"):
            out += [f"_Not run: {b['output']}._", ""]
            continue
        if not b["ok"]:
            tail = b.get("output", "").rstrip().splitlines()[-25:]
            out += ["**It failed**; its last output:", "", "```", *tail, "```", ""]
        for bench, rows in by_bench.items():
            out += [f"### {TITLES.get(bench, bench)}", "", *section(bench, rows), ""]
        apart = f"; measured apart from the full run, on {b['measured']}" if b.get("measured") else ""
        out += [f"_`{b.get('command')}` took {b.get('seconds', 0):.0f} s{apart}._", ""]
    return "\n".join(out) + "\n"
