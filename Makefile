# The two commands of the README: `make demo` and `make test`. Both install the dependencies first.
BUILD_DIR ?= build
JOBS ?= $(shell nproc)
DEMO_MODEL ?= models/jambo-demo
PROMPT ?= The meaning of life is

.PHONY: deps build demo test bench clean

deps:
	./scripts/install-deps

build: deps
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=Release >/dev/null
	cmake --build $(BUILD_DIR) -j $(JOBS)

demo: build
	@printf '%s' "$(PROMPT)"
	@$(BUILD_DIR)/jambo generate --model $(DEMO_MODEL) --prompt "$(PROMPT)" --max-tokens 60

test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS)

bench: build
	bench/cpu.sh $(BUILD_DIR)/jambo
	bench/cpu_batch.sh $(BUILD_DIR)/jambo
	bench/server_load.sh $(BUILD_DIR)/jambo
	bench/rollout.sh $(BUILD_DIR)/jambo cpu-demo

clean:
	rm -rf $(BUILD_DIR)
