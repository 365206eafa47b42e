# The one runner: README's two commands and .ci/run call these targets.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
CARGO ?= cargo

.PHONY: demo test setup-rust fmt-check clippy test-rust lab check-digests

demo: setup-rust ## Run the replay lab: every case, then the pinned summary.
	$(CARGO) run -q --release -p retryledger-core --example retry_fallback_replay -- --cases

test: setup-rust fmt-check clippy test-rust lab check-digests ## Everything, installing what it needs.

setup-rust:
	@rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt
	@rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy

fmt-check:
	$(CARGO) fmt --all -- --check

clippy:
	$(CARGO) clippy --workspace --all-targets -- -D warnings

test-rust:
	$(CARGO) test --workspace

lab:
	$(CARGO) run -q -p retryledger-core --example retry_fallback_replay

# Recompute the lab's digests from the written JSON with Python's own JSON
# encoder (sorted keys, no whitespace: RFC 8785 for integer-only documents).
check-digests: lab
	python3 tests/recompute_digests.py target/labs/retry-fallback
