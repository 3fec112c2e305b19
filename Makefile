# The two commands of the README: `make demo` and `make test`. Both install the dependencies first.
BUILD_DIR ?= build
JOBS ?= $(shell nproc)
DEMO_MODEL ?= models/jambo-demo
PROMPT ?= The meaning of life is

.PHONY: deps configure jambo build demo test bench clean

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

test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS)

bench: jambo
	bench/cpu.sh $(BUILD_DIR)/jambo
	bench/cpu_batch.sh $(BUILD_DIR)/jambo
	bench/server_load.sh $(BUILD_DIR)/jambo
	bench/rollout.sh $(BUILD_DIR)/jambo cpu-demo

clean:
	rm -rf $(BUILD_DIR)
