# The pip package "retryledger" (python/): the core as a Python extension
# (pyo3, abi3 for CPython >= 3.9), its typed API, drivers, openai integration
# and command line.
#
#   make python-setup   .venv with the pinned tools of python/requirements-dev.txt
#   make python-build   the extension, built by maturin into .venv (release)
#   make test-python    generated tables current, stubtest, mypy --strict, pytest (vectors read in place;
#                       Redis, PostgreSQL and a Temporal dev server of its own)
#   make bench-python   the sync driver against a bare loop, tenacity, stamina and backoff; store
#                       writes on SQLite and PostgreSQL next to a bare INSERT + COMMIT, a journal's cost
#                       per attempt on both, and the Temporal helper next to bare activity calls -> docs/BENCHMARKS.md
VENV := $(ROOT)/.venv
VENV_PY := $(VENV)/bin/python
VENV_STAMP := $(VENV)/.retryledger-requirements
PY_EXTENSION := python/retryledger/_core.abi3.so
PY_EXTENSION_SOURCES := $(wildcard python/src/*.rs core/src/*.rs core/src/*/*.rs) python/Cargo.toml core/Cargo.toml pyproject.toml Cargo.lock

TEST_TARGETS += test-python
BENCH_TARGETS += bench-python

.PHONY: python-setup python-build test-python bench-python

$(VENV_STAMP): python/requirements-dev.txt
	@test -x $(VENV_PY) || python3 -m venv $(VENV)
	$(VENV_PY) -m pip install -q --disable-pip-version-check -r python/requirements-dev.txt
	@touch $@

python-setup: $(VENV_STAMP)

$(PY_EXTENSION): $(VENV_STAMP) $(PY_EXTENSION_SOURCES)
	VIRTUAL_ENV=$(VENV) PATH="$(VENV)/bin:$$PATH" $(VENV)/bin/maturin develop --release --quiet
	@touch $@

python-build: $(PY_EXTENSION)

test-python: python-build setup-redis setup-postgres setup-temporal ## The pip package: generated tables current, stubs against the extension, mypy --strict, pytest (with its own Redis, PostgreSQL and Temporal dev server).
	@tmp=$$(mktemp) && $(VENV_PY) python/scripts/gen_tables.py tests/vectors/tables.json --out $$tmp \
		&& diff -u python/retryledger/_tables.py $$tmp; status=$$?; rm -f $$tmp; \
		if [ $$status -ne 0 ]; then echo "python/retryledger/_tables.py is stale: run python python/scripts/gen_tables.py --out python/retryledger/_tables.py" >&2; fi; \
		exit $$status
	$(VENV_PY) -m mypy.stubtest retryledger._core
	$(VENV_PY) -m mypy --strict python/retryledger python/tests python/benches
	tests/servers/with-postgres.sh tests/servers/with-redis.sh tests/servers/with-temporal.sh $(VENV_PY) -m pytest -q python/tests

bench-python: python-build setup-redis setup-postgres setup-temporal ## Sync driver vs tenacity, stamina, backoff and a bare loop (CPU and wall per call), into docs/BENCHMARKS.md.
	$(VENV_PY) python/benches/bench_driver.py --write docs/BENCHMARKS.md
	$(VENV_PY) python/benches/bench_stream.py --write docs/BENCHMARKS.md
	$(VENV_PY) python/benches/bench_repair.py --write docs/BENCHMARKS.md
	tests/servers/with-redis.sh $(VENV_PY) python/benches/bench_fleet.py --write docs/BENCHMARKS.md
	tests/servers/with-redis.sh $(VENV_PY) python/benches/bench_admission.py --write docs/BENCHMARKS.md
	tests/servers/with-postgres.sh $(VENV_PY) python/benches/bench_stores.py --write docs/BENCHMARKS.md
	tests/servers/with-postgres.sh $(VENV_PY) python/benches/bench_journal.py --write docs/BENCHMARKS.md
	tests/servers/with-temporal.sh $(VENV_PY) python/benches/bench_temporal.py --write docs/BENCHMARKS.md
	$(VENV_PY) python/benches/bench_hedge.py --write docs/BENCHMARKS.md
	$(VENV_PY) python/benches/bench_template.py
