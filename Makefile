# The two commands of the README: `make demo` and `make test`. Both set everything up first.
PY := .venv/bin/python
SETUP_INPUTS := pyproject.toml requirements/lock.txt scripts/setup.sh scripts/build_horovod.sh scripts/install_tensorflow.sh \
	hvd_magic/horovod_build/build.sh $(wildcard hvd_magic/horovod_build/patches/*.patch)

.PHONY: setup demo test bench matrix clean lock

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

# The support matrix (docs/install.md): each Python, torch, pyspark and ipykernel we claim, in a
# fresh venv from the wheel, a slice of the suite in each; needs pyenv's Pythons and the network.
matrix:
	python3 scripts/matrix.py $(MATRIX_ARGS)

clean:
	rm -rf .venv hvd_runs .pytest_cache
