# The fleet simulator (sim/, crate retryledger-sim).
#
#   make sim         every scenario's figures table (charts into a temporary directory)
#   make sim-docs    regenerate docs/sim-*.svg and the tables in README.md and docs/SIMULATION.md
#   make sim-check   the committed charts and tables are exactly what the simulator writes
#   make bench-sim   1,000,000 logical requests timed per strategy -> docs/BENCHMARKS.md
TEST_TARGETS += sim-check
BENCH_TARGETS += bench-sim

SIM_SCENARIOS := full_outage brownout rate_limited slow_tail
SIM := $(CARGO) run -q --release -p retryledger-sim --

.PHONY: sim sim-docs sim-check bench-sim

sim: ## Every scenario's figures table, side by side for every strategy.
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	for s in $(SIM_SCENARIOS); do $(SIM) $$s --charts "$$tmp" && echo; done

# The README shows the full-outage table; docs/SIMULATION.md every scenario's.
sim-docs: ## Regenerate the simulator's charts in docs/ and its tables in README.md and docs/SIMULATION.md.
	for s in $(SIM_SCENARIOS); do \
		extra=; if [ "$$s" = full_outage ]; then extra="--splice README.md"; fi; \
		$(SIM) $$s --charts docs --splice docs/SIMULATION.md $$extra >/dev/null; \
	done
	@echo "sim-docs: docs/sim-*.svg, README.md and docs/SIMULATION.md regenerated"

sim-check: ## The committed charts and tables are exactly what the simulator writes.
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	cp README.md docs/SIMULATION.md "$$tmp/"; \
	for s in $(SIM_SCENARIOS); do \
		extra=; if [ "$$s" = full_outage ]; then extra="--splice $$tmp/README.md"; fi; \
		$(SIM) $$s --charts "$$tmp" --splice "$$tmp/SIMULATION.md" $$extra >/dev/null; \
		stem=sim-$$(echo $$s | tr _ -); \
		diff docs/$$stem-load.svg "$$tmp/$$stem-load.svg" >/dev/null || { echo "docs/$$stem-load.svg differs: make sim-docs"; exit 1; }; \
		diff docs/$$stem-latency.svg "$$tmp/$$stem-latency.svg" >/dev/null || { echo "docs/$$stem-latency.svg differs: make sim-docs"; exit 1; }; \
	done; \
	diff README.md "$$tmp/README.md" && diff docs/SIMULATION.md "$$tmp/SIMULATION.md" && \
	echo "sim: charts and tables match the simulator"

bench-sim: ## Time 1,000,000 logical requests per strategy (release), into docs/BENCHMARKS.md.
	$(SIM) bench --requests 1000000 --write docs/BENCHMARKS.md
