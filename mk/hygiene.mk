# Repository hygiene.
#
#   make test-preserve-order  the core's tests with serde_json/preserve_order
#                             (any crate in a build can turn it on; decoding
#                             must not depend on the map's iteration order)
#   make deny                 cargo deny check (deny.toml): advisories, licenses,
#                             bans including duplicate versions, sources
TEST_TARGETS += test-preserve-order deny

DENY_VERSION := 0.20.2

.PHONY: test-preserve-order setup-deny deny

# --all-features: the core's optional parts too (serde_json's feature is not
# one of the core's own, so it is named).
test-preserve-order: ## The core's tests with serde_json's insertion-ordered map.
	$(CARGO) test -q -p retryledger-core --all-features --features serde_json/preserve_order

setup-deny:
	@cargo-deny --version 2>/dev/null | grep -qx 'cargo-deny $(DENY_VERSION)' || \
	  $(CARGO) install cargo-deny --version $(DENY_VERSION) --locked

# The advisory database is fetched first; where GitHub cannot be reached the
# check runs against the copy already in ~/.cargo/advisory-dbs, saying so
# (and fails if there is none).
deny: setup-deny ## cargo deny check over the workspace (fuzz/ is its own workspace).
	@$(CARGO) deny fetch db 2>/dev/null || \
	  echo "deny: the advisory database could not be fetched; checking against the local copy"
	$(CARGO) deny --offline check
