# Servers the tests use, from Debian's packages, installed once and started
# per test target on 127.0.0.1 on a free port (data under target/), stopped
# afterwards also when a test fails: tests/servers/with-*.sh.
#
#   make setup-redis   Debian's redis-server (apt-get), when it is missing

.PHONY: setup-redis

setup-redis:
	@command -v redis-server >/dev/null || { \
	  echo "installing redis-server"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq redis-server >/dev/null; }
	@# Debian starts a system service on install; the tests run their own.
	@if command -v systemctl >/dev/null && systemctl is-active --quiet redis-server 2>/dev/null; then $(SUDO) systemctl stop redis-server || true; fi

SUDO := $(shell [ "$$(id -u)" = 0 ] || command -v sudo >/dev/null && [ "$$(id -u)" != 0 ] && echo sudo)
