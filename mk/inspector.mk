# The in-browser inspector (js-demo/): a static page on the web build, with
# three views: receipt bundles, the fleet simulator and run journals.
#
#   make inspector-build  target/inspector: the page, the core's web build
#                         (wasm/pkg-web), the simulator's own module
#                         (sim-wasm/, target/sim-wasm), the lab cases and the
#                         journal samples of tests/vectors/journal.json
#   make inspector        serve it on 127.0.0.1:$(INSPECTOR_PORT)
#   make test-inspector   drive every view in Debian's Chromium; screenshots
#                         in target/screenshots/
INSPECTOR_DIR := $(ROOT)/target/inspector
INSPECTOR_PORT ?= 8080
WASM_WEB_DIR ?= $(ROOT)/wasm/pkg-web
# The fleet view's module: retryledger-sim over the core, built apart from
# the npm package (which does not grow), with the same wasm-bindgen and
# binaryen's wasm-opt as wasm/ (mk/wasm.mk).
SIM_WASM_DIR := $(ROOT)/target/sim-wasm
SIM_WASM_STAMP := $(SIM_WASM_DIR)/.built
SIM_WASM_SOURCES := $(wildcard core/src/*.rs core/src/*/*.rs sim/src/*.rs sim/scenarios/*.json sim-wasm/src/*.rs) \
  core/Cargo.toml sim/Cargo.toml sim-wasm/Cargo.toml Cargo.lock
INSPECTOR_FILES := index.html style.css app.js core.js timeline.js dom.js fleet.js fleet-worker.js journal.js chain.js

.PHONY: inspector inspector-build test-inspector setup-chromium sim-wasm clippy-sim-wasm

# Debian's chromium, installed only when absent (never a browser download).
setup-chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing Debian's chromium"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

js-demo/node_modules/.package-lock.json: js-demo/package-lock.json
	cd js-demo && npm ci --no-audit --no-fund
	@touch $@

# wasm/node_modules brings binaryen's wasm-opt ($(WASM_OPT), defined in mk/wasm.mk).
$(SIM_WASM_STAMP): $(SIM_WASM_SOURCES) wasm/node_modules/.package-lock.json | setup-wasm
	$(CARGO) build --release --target wasm32-unknown-unknown -p retryledger-sim-wasm
	rm -rf $(SIM_WASM_DIR) && mkdir -p $(SIM_WASM_DIR)
	wasm-bindgen --target web --no-typescript --out-dir $(SIM_WASM_DIR) --out-name retryledger_sim \
	  target/wasm32-unknown-unknown/release/retryledger_sim_wasm.wasm
	cd wasm && $(WASM_OPT) $(SIM_WASM_DIR)/retryledger_sim_bg.wasm -o $(SIM_WASM_DIR)/retryledger_sim_bg.wasm
	@touch $@

sim-wasm: $(SIM_WASM_STAMP) ## The fleet view's simulator module (target/sim-wasm).

# The exports are gated on wasm32, so `make clippy` (the host) does not see them.
clippy-sim-wasm: setup-wasm
	$(CARGO) clippy -p retryledger-sim-wasm --target wasm32-unknown-unknown -- -D warnings

inspector-build: wasm-web lab $(SIM_WASM_STAMP)
	rm -rf $(INSPECTOR_DIR) && mkdir -p $(INSPECTOR_DIR)/pkg $(INSPECTOR_DIR)/sim
	cp $(addprefix js-demo/,$(INSPECTOR_FILES)) $(INSPECTOR_DIR)/
	cp $(WASM_WEB_DIR)/retryledger_wasm.js $(WASM_WEB_DIR)/retryledger_wasm_bg.wasm $(INSPECTOR_DIR)/pkg/
	cp $(SIM_WASM_DIR)/retryledger_sim.js $(SIM_WASM_DIR)/retryledger_sim_bg.wasm $(INSPECTOR_DIR)/sim/
	cp "$$(ls -t target/labs/retry-fallback/*.json | head -n 1)" $(INSPECTOR_DIR)/lab.json
	node js-demo/scripts/journal-samples.mjs tests/vectors/journal.json $(INSPECTOR_DIR)/journals.json

inspector: inspector-build ## Serve the inspector on 127.0.0.1.
	@echo "inspector on http://127.0.0.1:$(INSPECTOR_PORT)/"
	cd $(INSPECTOR_DIR) && python3 -m http.server $(INSPECTOR_PORT) --bind 127.0.0.1

test-inspector: setup-chromium clippy-sim-wasm inspector-build js-demo/node_modules/.package-lock.json
	cd js-demo && node --test test/

TEST_TARGETS += test-inspector
