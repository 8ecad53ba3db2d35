# The two commands of the README: `make demo` and `make test`. Both set everything up first.
PY := .venv/bin/python
SETUP_INPUTS := pyproject.toml requirements/lock.txt scripts/setup.sh scripts/build_horovod.sh scripts/install_tensorflow.sh \
	hvd_magic/horovod_build/build.sh $(wildcard hvd_magic/horovod_build/patches/*.patch)

.PHONY: setup demo test bench clean lock

setup: .venv/.setup-done

.venv/.setup-done: $(SETUP_INPUTS)
	bash scripts/setup.sh
	touch $@

demo: setup
	$(PY) -m hvd_magic.demo notebooks/quickstart.ipynb

test: setup
	$(PY) -m pytest -n 2 --dist loadfile --durations=25 $(PYTEST_ARGS)

# The newest releases of every dependency in a venv of their own, the suite run against them, and
# requirements/lock.txt rewritten only if it passes (scripts/refresh_lock.sh says what changed).
lock:
	bash scripts/refresh_lock.sh

bench: setup
	$(PY) bench/run_all.py

clean:
	rm -rf .venv hvd_runs .pytest_cache
