# Repository hygiene: the core against serde_json's other map order.
#
#   make test-preserve-order  the core's tests with serde_json/preserve_order
#                             (any crate in a build can turn it on; decoding
#                             must not depend on the map's iteration order)
TEST_TARGETS += test-preserve-order

.PHONY: test-preserve-order

test-preserve-order: ## The core's tests with serde_json's insertion-ordered map.
	$(CARGO) test -q -p retryledger-core --features serde_json/preserve_order
