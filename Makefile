# The one runner: README's two commands and .ci/run call these targets.
#
# Each part of the project adds its own fragment under mk/ and appends its
# targets to TEST_TARGETS / BENCH_TARGETS, so `make test` and `make bench`
# always run everything.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
CARGO ?= cargo
ROOT := $(abspath $(dir $(lastword $(MAKEFILE_LIST))))

TEST_TARGETS := fmt-check clippy test-rust lab check-digests
BENCH_TARGETS :=

.PHONY: demo test bench setup-rust fmt-check clippy test-rust lab check-digests

demo: setup-rust ## Run the replay lab: every case, then the pinned summary.
	$(CARGO) run -q --release -p retryledger-core --features lab --example retry_fallback_replay -- --cases

include $(sort $(wildcard mk/*.mk))

test: setup-rust $(TEST_TARGETS) ## Everything, installing what it needs.

bench: setup-rust $(BENCH_TARGETS) ## Benchmarks, side by side with the alternatives.

setup-rust:
	@rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt
	@rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy

fmt-check: setup-rust
	$(CARGO) fmt --all -- --check

# The replay lab is the core's non-default `lab` feature: the workspace with it,
# and the core once more without it, as a plain dependency compiles it.
clippy: setup-rust
	$(CARGO) clippy --workspace --all-targets --features retryledger-core/lab -- -D warnings
	$(CARGO) clippy -p retryledger-core --all-targets -- -D warnings

test-rust:
	$(CARGO) test --workspace --features retryledger-core/lab

lab:
	$(CARGO) run -q -p retryledger-core --features lab --example retry_fallback_replay

# Recompute the lab's digests from the written JSON with Python's own JSON
# encoder (sorted keys, no whitespace: RFC 8785 for integer-only documents).
check-digests: lab
	python3 tests/recompute_digests.py target/labs/retry-fallback
	python3 tests/replay_from_spec.py tests/vectors
