# Conformance vectors, property tests, fuzzing and benchmarks of the core.
#
#   make vectors        regenerate tests/vectors/ in place
#   make vectors-check  regenerate into a temporary directory, fail on any diff
#   make properties     the proptest invariants, 10,000 cases each (release)
#   make fuzz           every cargo-fuzz target for FUZZ_SECONDS each (nightly)
#   make bench-core     criterion benchmarks of the core
TEST_TARGETS += vectors-check properties
BENCH_TARGETS += bench-core

FUZZ_SECONDS ?= 60
FUZZ_TARGETS := decode_policy decode_attempts decode_bundle decode_observation \
	retry_after plan_next evaluate verify_bundle digest \
	judge request build_policy price_cost provider_body journal idempotency admission_observe repair_chain \
	machine
PROPERTY_CASES ?= 10000

.PHONY: vectors vectors-check properties fuzz fuzz-setup bench-core

vectors: ## Regenerate the conformance vectors in tests/vectors/.
	$(CARGO) run -q -p retryledger-core --features lab --example vectors -- tests/vectors

vectors-check: ## The committed vectors are exactly what the core generates.
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	$(CARGO) run -q -p retryledger-core --features lab --example vectors -- "$$tmp/vectors" && \
	diff -r tests/vectors "$$tmp/vectors" && echo "vectors: no difference"

properties: ## Property tests, PROPERTY_CASES cases per property, in release.
	RETRYLEDGER_PROPERTY_CASES=$(PROPERTY_CASES) $(CARGO) test -q --release -p retryledger-core --features lab --test properties --test over_cap --test provider --test journal_properties --test ratelimit --test machine

fuzz-setup:
	@rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
	@command -v cargo-fuzz >/dev/null 2>&1 || $(CARGO) install cargo-fuzz --locked

fuzz: fuzz-setup ## Each fuzz target for FUZZ_SECONDS seconds (default 60), seeded with the vectors.
	python3 fuzz/seed_corpus.py
	@mkdir -p target/fuzz-logs
	cd fuzz && for t in $(FUZZ_TARGETS); do \
		echo "== $$t ($(FUZZ_SECONDS) s)"; \
		cargo +nightly fuzz run $$t -- -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 \
			> ../target/fuzz-logs/$$t.log 2>&1 || { tail -40 ../target/fuzz-logs/$$t.log; exit 1; }; \
		grep -E '^Done|stat::(number_of_executed_units|average_exec_per_sec|new_units_added)' ../target/fuzz-logs/$$t.log; \
	done

bench-core: ## Criterion benchmarks of the core.
	$(CARGO) bench -p retryledger-core --features lab --bench core
	$(CARGO) bench -p retryledger-core --features lab --bench machine
