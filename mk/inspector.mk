# The in-browser receipt inspector (js-demo/): a static page on the web build.
INSPECTOR_DIR := $(ROOT)/target/inspector
INSPECTOR_PORT ?= 8080
WASM_WEB_DIR ?= $(ROOT)/wasm/pkg-web

.PHONY: inspector inspector-build test-inspector setup-chromium

# Debian's chromium, installed only when absent (never a browser download).
setup-chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing Debian's chromium"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

js-demo/node_modules/.package-lock.json: js-demo/package-lock.json
	cd js-demo && npm ci --no-audit --no-fund
	@touch $@

inspector-build: wasm-web lab
	rm -rf $(INSPECTOR_DIR) && mkdir -p $(INSPECTOR_DIR)/pkg
	cp js-demo/index.html js-demo/style.css js-demo/app.js js-demo/core.js js-demo/timeline.js $(INSPECTOR_DIR)/
	cp $(WASM_WEB_DIR)/retryledger_wasm.js $(WASM_WEB_DIR)/retryledger_wasm_bg.wasm $(INSPECTOR_DIR)/pkg/
	cp "$$(ls -t target/labs/retry-fallback/*.json | head -n 1)" $(INSPECTOR_DIR)/lab.json

inspector: inspector-build ## Serve the inspector on 127.0.0.1.
	@echo "inspector on http://127.0.0.1:$(INSPECTOR_PORT)/"
	cd $(INSPECTOR_DIR) && python3 -m http.server $(INSPECTOR_PORT) --bind 127.0.0.1

test-inspector: setup-chromium inspector-build js-demo/node_modules/.package-lock.json
	cd js-demo && node --test test/

TEST_TARGETS += test-inspector
