# piper — the two commands a user needs: `make run` and `make test`.
BUILD   ?= build
JOBS    ?= $(shell nproc)
NP      ?= 1
CONFIG  ?= config/default.yaml
CMAKE_FLAGS ?=

.PHONY: all deps build run test bench corpus clean

all: build

deps:
	@scripts/install-deps.sh

$(BUILD)/Makefile: CMakeLists.txt
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS)

build: $(BUILD)/Makefile
	cmake --build $(BUILD) -j $(JOBS)

corpus: build
	@scripts/make-corpus.sh $(BUILD)

run: deps build corpus
	mpirun --oversubscribe --bind-to none $(if $(filter 0,$(shell id -u)),--allow-run-as-root) -np $(NP) \
	  $(BUILD)/piper train $(CONFIG)

test: deps build corpus
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

bench: deps build corpus
	@scripts/bench.sh $(BUILD)
	@scripts/bench-parallel.sh $(BUILD)
	@scripts/bench-checkpoint.sh $(BUILD)
	@bench/sim_accuracy.py $(BUILD)

clean:
	rm -rf $(BUILD)
