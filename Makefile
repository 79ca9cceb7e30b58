# piper — the two commands a user needs: `make run` and `make test`; `make fuzz` and `make sanitize`
# for the fuzzers and the sanitizer build (docs/testing.md).
BUILD   ?= build
JOBS    ?= $(shell nproc)
NP      ?= 1
CONFIG  ?= config/default.yaml
CMAKE_FLAGS ?=
# make fuzz: clang + libFuzzer + ASan/UBSan in FUZZ_BUILD, FUZZ_TIME seconds per harness (FUZZ_READERS: a subset).
FUZZ_BUILD   ?= build-fuzz
FUZZ_TIME    ?= 60
FUZZ_READERS ?=
# make sanitize: g++ ASan + UBSan build in ASAN_BUILD, its CUDA backend on the emulated GPU, and three test
# selections (docs/testing.md): tests without MPI, tests that start MPI, a sample of the end-to-end tests.
ASAN_BUILD         ?= build-asan
SANITIZE_TESTS     ?= -L '^(kernel_tests|unit_.*|fuzz)$$' -LE '^(unit_checkpoint|unit_runtime|fuzz_mpi)$$'
SANITIZE_MPI_TESTS ?= -L '^(unit_checkpoint|unit_runtime|comm_mpi|checkpoint_mpi|fuzz_mpi)$$' -E '^DeviceTraining\.CudaBf16ProductsMatchTheCpus$$'
SANITIZE_E2E       ?= -R '^(Experts/MoeParity\.MatchesSingleRank/ep2_dp2_zero3$$|Cli\.|Table/BadInput\.|Training\.(TinyLossFalls|RunsUnderMpirun)$$|Checkpoint\.(InspectVerifyAndCorruption|OtherModelRefused)$$|Directives\.HandWritten1F1BPlansLikeTheSchedule$$|SimulateCli\.JsonHasStepTimeAndPerRankFigures$$)'

.PHONY: all deps build run test bench corpus clean fuzz sanitize

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
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS); rc=$$?; cd $(CURDIR) && scripts/not-run.sh $(BUILD); exit $$rc

bench: deps build corpus
	@scripts/bench.sh $(BUILD)
	@scripts/bench-parallel.sh $(BUILD)
	@scripts/bench-checkpoint.sh $(BUILD)
	@bench/sim_accuracy.py $(BUILD)
	@bench/schedules.py $(BUILD)
	@bench/moe.py $(BUILD)
	@bench/tuner.py $(BUILD)
	@bench/tuner_measured.py $(BUILD)
	@bench/tokenizer.py $(BUILD)
	@bench/switch_sim.py $(BUILD)
	@bench/switching.py $(BUILD)

fuzz: deps
	cmake -S . -B $(FUZZ_BUILD) -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang \
	  -DPIPER_LIBFUZZER=ON -DPIPER_SANITIZE=ON -DPIPER_CUDA=OFF $(CMAKE_FLAGS)
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target fuzz_tests
	tests/fuzz/run-libfuzzer.sh $(FUZZ_BUILD) $(FUZZ_TIME) $(FUZZ_READERS)

sanitize: deps
	cmake -S . -B $(ASAN_BUILD) -DPIPER_SANITIZE=ON -DPIPER_CUDA=OFF -DPIPER_CUDA_EMULATOR=ON $(CMAKE_FLAGS)
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	@scripts/make-corpus.sh $(ASAN_BUILD)
	tests/sanitizers/run.sh $(ASAN_BUILD) $(JOBS) "$(SANITIZE_TESTS)" "$(SANITIZE_MPI_TESTS)" "$(SANITIZE_E2E)"

clean:
	rm -rf $(BUILD)
