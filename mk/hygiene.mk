# Repository hygiene.
#
#   make test-preserve-order  the core's tests with serde_json/preserve_order
#                             (any crate in a build can turn it on; decoding
#                             must not depend on the map's iteration order)
#   make deny                 cargo deny check (deny.toml): advisories, licenses,
#                             bans including duplicate versions, sources
#   make msrv                 the libraries checked with the workspace's
#                             rust-version (Cargo.toml), the toolchain
#                             installed only when missing
#   make doc                  the core's API docs, every warning (a broken or
#                             private intra-doc link, ...) an error
#   make hosts-thin           no outcome decoding and no attempts or receipt
#                             document built in wasm/ts or python/retryledger
#                             (tests/hosts_thin.sh, after its self-test)
TEST_TARGETS += test-preserve-order deny msrv doc hosts-thin

DENY_VERSION := 0.20.2

MSRV := $(shell sed -n 's/^rust-version = "\([0-9.]*\)"$$/\1/p' Cargo.toml)
MSRV_CARGO = CARGO_TARGET_DIR=$(ROOT)/target/msrv cargo +$(MSRV)

.PHONY: test-preserve-order setup-deny deny setup-msrv msrv doc hosts-thin

# --all-features: the core's optional parts too (serde_json's feature is not
# one of the core's own, so it is named).
test-preserve-order: ## The core's tests with serde_json's insertion-ordered map.
	$(CARGO) test -q -p retryledger-core --all-features --features serde_json/preserve_order

setup-deny:
	@cargo-deny --version 2>/dev/null | grep -qx 'cargo-deny $(DENY_VERSION)' || \
	  $(CARGO) install cargo-deny --version $(DENY_VERSION) --locked

# The advisory database is fetched first. Where GitHub cannot be reached the
# check runs against the copy already in ~/.cargo/advisory-dbs, saying so;
# where there is no copy at all, licenses, bans and sources are still checked
# and the output says plainly that advisories were not.
ADVISORY_DBS := $(or $(CARGO_HOME),$(HOME)/.cargo)/advisory-dbs

deny: setup-deny ## cargo deny check over the workspace (fuzz/ is its own workspace).
	@# The check runs offline: every crate of the lock file is fetched first
	@# (on a fresh machine nothing may have downloaded the wasm crates yet).
	$(CARGO) fetch --locked
	@$(CARGO) deny fetch db 2>/dev/null || \
	  echo "deny: the advisory database could not be fetched; checking against the local copy"
	@if ls -d $(ADVISORY_DBS)/*/ >/dev/null 2>&1; then \
	  $(CARGO) deny --offline check; \
	else \
	  echo "deny: NO ADVISORY DATABASE (unreachable, no local copy): advisories NOT checked"; \
	  $(CARGO) deny --offline check licenses bans sources; \
	fi

setup-msrv:
	@test -n '$(MSRV)' || { echo 'Cargo.toml must set rust-version = "1.N"'; exit 1; }
	@rustup toolchain list | cut -d- -f1 | grep -qx '$(MSRV)' || \
	  rustup toolchain install $(MSRV) --profile minimal
	@rustup target list --toolchain $(MSRV) --installed | grep -qx wasm32-unknown-unknown || \
	  rustup target add --toolchain $(MSRV) wasm32-unknown-unknown

# The libraries only: the dev-dependencies need a newer toolchain (see the
# comment on rust-version). Its own target directory: no rebuild churn.
msrv: setup-msrv ## The libraries, every feature on, checked with the MSRV toolchain.
	$(MSRV_CARGO) check --workspace --lib --all-features --locked
	$(MSRV_CARGO) check -p retryledger-wasm --lib --all-features --target wasm32-unknown-unknown --locked
	$(MSRV_CARGO) check -p retryledger-sim-wasm --lib --all-features --target wasm32-unknown-unknown --locked

# Its own target directory, so the warnings-as-errors flags cause no rebuild
# churn elsewhere.
doc: ## The core's rustdoc (every feature), warnings denied, into target/doc-check.
	RUSTDOCFLAGS='-D warnings' CARGO_TARGET_DIR=$(ROOT)/target/doc-check $(CARGO) doc -q -p retryledger-core --all-features --no-deps --locked

hosts-thin: ## No outcome decoding or attempts/receipt document construction in the TypeScript and Python hosts.
	tests/hosts_thin.sh --self-test
	tests/hosts_thin.sh
