# The two commands of the README: `make demo` and `make test`. Both install the dependencies first.
BUILD_DIR ?= build
SANITIZE_DIR ?= build-asan
FUZZ_SECONDS ?= 20
JOBS ?= $(shell nproc)
DEMO_MODEL ?= models/jambo-demo
PROMPT ?= The meaning of life is

.PHONY: deps configure jambo build demo test test-sanitize bench clean

deps:
	./scripts/install-deps

configure: deps
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=Release >/dev/null

# The demo needs the jambo command alone; the tests need everything.
jambo: configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target jambo

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

demo: jambo
	@printf '%s' "$(PROMPT)"
	@$(BUILD_DIR)/jambo generate --model $(DEMO_MODEL) --prompt "$(PROMPT)" --max-tokens 60

# Every test, then every test again under ASan and UBSan (clang, no CUDA), with each fuzz target run for
# FUZZ_SECONDS (docs/DESIGN.md: Testing).
test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS)
	$(MAKE) --no-print-directory test-sanitize

test-sanitize: deps
	cmake -S . -B $(SANITIZE_DIR) -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=clang++ -DJAMBO_CUDA=OFF \
	  -DJAMBO_FUZZ=ON -DJAMBO_FUZZ_SECONDS=$(FUZZ_SECONDS) >/dev/null
	cmake --build $(SANITIZE_DIR) -j $(JOBS)
	cd $(SANITIZE_DIR) && ctest --output-on-failure -j $(JOBS)

bench: jambo
	bench/cpu.sh $(BUILD_DIR)/jambo
	bench/cpu_batch.sh $(BUILD_DIR)/jambo
	bench/server_load.sh $(BUILD_DIR)/jambo
	bench/rollout.sh $(BUILD_DIR)/jambo cpu-demo

clean:
	rm -rf $(BUILD_DIR) $(SANITIZE_DIR)
