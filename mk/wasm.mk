# The npm package "retryledger" (wasm/): the core as WebAssembly for Node and
# browsers, its TypeScript API and driver.
#
#   make wasm-node   wasm/pkg-node (wasm-pack --target nodejs, then wasm-opt -Oz) and wasm/dist
#   make wasm-web    wasm/pkg-web  (wasm-pack --target web,    then wasm-opt -Oz) and wasm/dist
#   make test-wasm   clippy for wasm32, wasm/ts/tables.ts current with tests/vectors/tables.json,
#                    tsc --strict over sources, declarations and tests, node --test (with Redis,
#                    PostgreSQL and a Temporal dev server of its own)
#   make bench-wasm  driver CPU and wall per call against p-retry, cockatiel and a bare loop; wasm size (opt-level 2 and z);
#                    store writes on SQLite and PostgreSQL next to a bare INSERT + COMMIT -> docs/BENCHMARKS.md
#
# Installs what it needs, skipping what is there: the wasm32 target, wasm-pack,
# wasm-bindgen-cli at the crate's exact wasm-bindgen version, and `npm ci`
# (which brings binaryen's wasm-opt; wasm-pack's own download is turned off in
# wasm/Cargo.toml).
TEST_TARGETS += test-wasm
BENCH_TARGETS += bench-wasm

# The exact wasm-bindgen pin of wasm/Cargo.toml (`wasm-bindgen = "=0.2.N"`), set there only.
WASM_BINDGEN_VERSION := $(shell sed -n 's/^wasm-bindgen = "=\([0-9.]*\)"$$/\1/p' wasm/Cargo.toml)
WASM_PACK_VERSION := 0.15.1
WASM_STAMP_NODE = wasm/pkg-node/.built-O$(WASM_OPT_LEVEL)
WASM_STAMP_WEB = wasm/pkg-web/.built-O$(WASM_OPT_LEVEL)
WASM_STAMP_TS := wasm/dist/.built
# The browser build's module as base64 text, for the Temporal workflow isolate (retryledger/temporal).
WASM_BASE64 := wasm/pkg-web/retryledger_wasm_base64.js
WASM_NPM_STAMP := wasm/node_modules/.package-lock.json
WASM_RUST_SOURCES := $(wildcard core/src/*.rs core/src/*/*.rs wasm/src/*.rs) core/Cargo.toml wasm/Cargo.toml Cargo.lock
WASM_TS_SOURCES := $(wildcard wasm/ts/*.ts wasm/ts/stores/*.ts) wasm/tsconfig.json wasm/tsconfig.temporal.json wasm/tsconfig.frameworks.json
# The module ships at opt-level 2 (SHA-256 at 3 through WASM_CARGO_ARGS): a
# run's cost is mostly the core's, and the speed target of docs/BENCHMARKS.md
# (the driver against p-retry) holds only there; opt-level z is about a third
# smaller and about 1.3 times slower. `make bench` builds the other flavour
# too and reports both side by side, and WASM_OPT_LEVEL=z makes the shipped
# module the small one. The native profile stays as the workspace sets it.
WASM_OPT_LEVEL ?= 2
WASM_ALT_OPT_LEVEL := $(if $(filter z,$(WASM_OPT_LEVEL)),2,z)
WASM_PACK_AT = CARGO_PROFILE_RELEASE_OPT_LEVEL=$(1) wasm-pack build --release --mode no-install --out-name retryledger_wasm
WASM_PACK = $(call WASM_PACK_AT,$(WASM_OPT_LEVEL))
WASM_CARGO_ARGS := -- --config profile.release.package.sha2.opt-level=3
WASM_STAMP_SIZE = wasm/pkg-size/.built-O$(WASM_ALT_OPT_LEVEL)
WASM_OPT := node node_modules/binaryen/bin/wasm-opt -Oz --enable-bulk-memory --enable-nontrapping-float-to-int --enable-sign-ext --enable-mutable-globals --enable-reference-types --enable-multivalue --strip-debug --strip-producers

.PHONY: setup-wasm wasm-node wasm-web test-wasm clippy-wasm tables-wasm typecheck-wasm bench-wasm

setup-wasm:
	@rustup target list --installed 2>/dev/null | grep -qx wasm32-unknown-unknown || rustup target add wasm32-unknown-unknown
	@wasm-pack --version 2>/dev/null | grep -qx 'wasm-pack $(WASM_PACK_VERSION)' || \
	  $(CARGO) install wasm-pack --version $(WASM_PACK_VERSION) --locked
	@test -n '$(WASM_BINDGEN_VERSION)' || { echo 'wasm/Cargo.toml must pin wasm-bindgen = "=0.2.N"'; exit 1; }
	@wasm-bindgen --version 2>/dev/null | grep -qx 'wasm-bindgen $(WASM_BINDGEN_VERSION)' || \
	  $(CARGO) install wasm-bindgen-cli --version $(WASM_BINDGEN_VERSION) --locked

$(WASM_NPM_STAMP): wasm/package.json wasm/package-lock.json
	cd wasm && npm ci --no-audit --no-fund
	@touch $@

$(WASM_STAMP_NODE): $(WASM_RUST_SOURCES) $(WASM_NPM_STAMP) | setup-wasm
	cd wasm && $(WASM_PACK) --target nodejs --out-dir pkg-node . $(WASM_CARGO_ARGS)
	cd wasm && $(WASM_OPT) pkg-node/retryledger_wasm_bg.wasm -o pkg-node/retryledger_wasm_bg.wasm
	@rm -f wasm/pkg-node/.built*; touch $@

$(WASM_STAMP_WEB): $(WASM_RUST_SOURCES) $(WASM_NPM_STAMP) | setup-wasm
	cd wasm && $(WASM_PACK) --target web --out-dir pkg-web . $(WASM_CARGO_ARGS)
	cd wasm && $(WASM_OPT) pkg-web/retryledger_wasm_bg.wasm -o pkg-web/retryledger_wasm_bg.wasm
	@rm -f wasm/pkg-web/.built*; touch $@

# The other opt-level flavour for the benchmark's side-by-side figures (own target dir: no rebuild churn).
$(WASM_STAMP_SIZE): $(WASM_RUST_SOURCES) $(WASM_NPM_STAMP) | setup-wasm
	cd wasm && CARGO_TARGET_DIR=$(ROOT)/target/wasm-size $(call WASM_PACK_AT,$(WASM_ALT_OPT_LEVEL)) --target nodejs --out-dir pkg-size . $(WASM_CARGO_ARGS)
	cd wasm && $(WASM_OPT) pkg-size/retryledger_wasm_bg.wasm -o pkg-size/retryledger_wasm_bg.wasm
	@rm -f wasm/pkg-size/.built*; touch $@

$(WASM_BASE64): $(WASM_STAMP_WEB) wasm/scripts/gen-wasm-base64.mjs
	cd wasm && node scripts/gen-wasm-base64.mjs

# retryledger/temporal compiles on its own (tsconfig.temporal.json: the
# @temporalio declarations are skipped, not checked), and so do
# retryledger/ai-sdk and retryledger/langchain (tsconfig.frameworks.json).
$(WASM_STAMP_TS): $(WASM_TS_SOURCES) $(WASM_STAMP_NODE) $(WASM_STAMP_WEB) $(WASM_BASE64)
	rm -rf wasm/dist
	cd wasm && node_modules/.bin/tsc -p tsconfig.json
	cd wasm && node_modules/.bin/tsc -p tsconfig.temporal.json
	cd wasm && node_modules/.bin/tsc -p tsconfig.frameworks.json
	@touch $@

wasm-node: $(WASM_STAMP_NODE) $(WASM_STAMP_TS) ## The Node build of the npm package.

wasm-web: $(WASM_STAMP_WEB) $(WASM_STAMP_TS) ## The browser build: wasm/pkg-web and wasm/dist/web.js.

clippy-wasm: setup-wasm
	$(CARGO) clippy -p retryledger-wasm --target wasm32-unknown-unknown -- -D warnings

# wasm/ts/tables.ts is generated from the core's tables; regenerate it into a
# temporary file and fail on any difference (`node wasm/scripts/gen-tables.mjs` updates it).
tables-wasm:
	@tmp=$$(mktemp) && trap 'rm -f "$$tmp"' EXIT && \
	  node wasm/scripts/gen-tables.mjs --out "$$tmp" && \
	  diff -u wasm/ts/tables.ts "$$tmp" || { echo 'wasm/ts/tables.ts is stale: run node wasm/scripts/gen-tables.mjs'; exit 1; }

typecheck-wasm: $(WASM_STAMP_TS)
	cd wasm && node_modules/.bin/tsc -p tsconfig.check.json
	cd wasm && node_modules/.bin/tsc -p tsconfig.check-temporal.json
	cd wasm && node_modules/.bin/tsc -p tsconfig.check-frameworks.json

test-wasm: clippy-wasm tables-wasm typecheck-wasm setup-redis setup-postgres setup-temporal ## Every npm-package test, on the wasm-opt'd module (with its own Redis, PostgreSQL and Temporal dev server).
	cd wasm && ../tests/servers/with-postgres.sh ../tests/servers/with-redis.sh ../tests/servers/with-temporal.sh node --test --test-concurrency=1 test/

bench-wasm: $(WASM_STAMP_TS) $(WASM_STAMP_SIZE) setup-redis setup-postgres ## Driver CPU and wall per call against p-retry and cockatiel, and module size, into docs/BENCHMARKS.md.
	cd wasm && WASM_OPT_LEVEL=$(WASM_OPT_LEVEL) WASM_ALT_OPT_LEVEL=$(WASM_ALT_OPT_LEVEL) ../tests/servers/with-postgres.sh ../tests/servers/with-redis.sh node bench/run.mjs --write ../docs/BENCHMARKS.md
	cd wasm && ../tests/servers/with-postgres.sh node bench/stores.mjs --write ../docs/BENCHMARKS.md
	cd wasm && ../tests/servers/with-postgres.sh node bench/journal.mjs --write ../docs/BENCHMARKS.md
	cd wasm && node bench/template.mjs
	cd wasm && node bench/hedge.mjs --write ../docs/BENCHMARKS.md
	cd wasm && node bench/repair.mjs --write ../docs/BENCHMARKS.md
