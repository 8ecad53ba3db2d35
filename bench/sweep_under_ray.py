"""The sweep of bench/bench_sweeps.py under Ray Tune with TorchTrainer: one repetition, run by
an interpreter that has Ray (`bench_sweeps.py --ray PYTHON` starts it; hvd_magic is not needed
here, nor imported).

8 trials (a grid of 8 learning rates), 2 at once (`max_concurrent_trials=2`); each trial a
TorchTrainer of 2 workers (`ScalingConfig(num_workers=2)`, a Gloo process group) whose workers
sleep through 20 steps of 0.1 s and report each one with `ray.train.report`. Ray Train V2 (the
default since Ray 2.51) runs Train inside Tune this way: a Tune trial is a function that builds
and fits a TorchTrainer, whose reports reach Tune through `TuneReportCallback`.

A local Ray is started here and shut down at the end; the times are written to --out as JSON:
``import`` (import ray), ``start`` (`ray.init`), ``sweep`` (`Tuner.fit()`: from the call to
every trial done, as `hvd_magic.sweep` is timed), ``shutdown`` and each trial's own time
(``own``: Tune's ``time_total_s``, from the trial's start to its last report).

    PYTHON bench/sweep_under_ray.py --out PATH [--trials 8] [--steps 20] [--pause 0.1]

Not a test, and not a benchmark of its own: bench_sweeps.py makes its rows.
"""

import argparse
import json
import tempfile
import time


def train_fn_per_worker(config):
    """One TorchTrainer worker: the steps of bench_sweeps.py's `trial`, reported to Ray Train."""
    import ray.train
    for step in range(1, config["steps"] + 1):
        time.sleep(config["pause"])
        ray.train.report({"step": step, "loss": config["lr"] / step})


def train_driver_fn(config):
    """One Tune trial: a TorchTrainer of 2 workers on this trial's values."""
    import ray.tune
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback
    trial = ray.tune.get_context().get_trial_id()
    trainer = TorchTrainer(
        train_fn_per_worker, train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
        run_config=RunConfig(name=f"train-{trial}", storage_path=config["storage"],
                             callbacks=[TuneReportCallback()]))
    trainer.fit()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="write the times here (JSON)")
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--pause", type=float, default=0.1)
    args = parser.parse_args()
    times = {}
    start = time.perf_counter()
    import ray
    import ray.tune
    times["import"] = time.perf_counter() - start
    with tempfile.TemporaryDirectory(prefix="bench-sweeps-ray-") as storage:
        # Logical CPUs: a trial is its Tune function (1) and its 2 workers (1 each), so 6 fit
        # two trials, as hvd_magic's sweep is given 4 slots for 2 × 2 ranks; the steps sleep,
        # so the 2 real cores are not what is measured.
        start = time.perf_counter()
        ray.init(num_cpus=6, include_dashboard=False, object_store_memory=256 * 2**20,
                 logging_level="warning", log_to_driver=False)
        times["start"] = time.perf_counter() - start
        space = {"lr": ray.tune.grid_search([0.1 * (i + 1) for i in range(args.trials)]),
                 "steps": args.steps, "pause": args.pause, "storage": storage}
        tuner = ray.tune.Tuner(
            train_driver_fn, param_space=space,
            tune_config=ray.tune.TuneConfig(max_concurrent_trials=2),
            run_config=ray.tune.RunConfig(name="sweep", storage_path=storage, verbose=0))
        start = time.perf_counter()
        results = tuner.fit()
        times["sweep"] = time.perf_counter() - start
        errors = [str(r.error) for r in results if r.error]
        times["own"] = [r.metrics.get("time_total_s") for r in results]
        times["steps"] = [r.metrics.get("step") for r in results]
        start = time.perf_counter()
        ray.shutdown()
        times["shutdown"] = time.perf_counter() - start
    times["ray"] = ray.__version__
    with open(args.out, "w") as f:
        json.dump(times, f)
    if errors:
        raise SystemExit(f"{len(errors)} trial(s) failed under Ray: {errors[0][:2000]}")


if __name__ == "__main__":
    main()
