# KaiTian front door. `make demo` shows it working, `make test` proves it.
# Everything goes through CMake; build trees live in build/ (release),
# build-asan/ (ASan + UBSan) and build-tsan/ (ThreadSanitizer).

PREFIX ?= /usr/local
JOBS ?= $(shell nproc)
BUILD ?= build
CTEST_FLAGS ?= --output-on-failure
# Debian packages the build and the tests need (installed when missing).
DEB_PACKAGES := gcc make cmake iproute2 procps pkg-config \
  python3-torch python3-numpy python3-sklearn python3-setuptools python3-pip python3-wheel python3-venv
# The cluster managers the launch tests run under (tests/launcher/slurm.sh):
# installed when missing; where they cannot be, those tests skip and say why.
DEB_OPTIONAL := slurm-wlm munge openmpi-bin mpich
# The interpreter with torch (Debian's python3-torch); the python3 first on
# PATH may be another one.
PYTHON ?= /usr/bin/python3
# The PyTorch side runs from the source tree with this build's library.
KT_PY_ENV = KAITIAN_LIBRARY=$(abspath $(BUILD))/libkaitian.so PYTHONPATH=$(CURDIR)/python PYTHON=$(PYTHON)
# The second torch: 2.x from PyPI in a venv the suite makes once (the test
# python2_venv, tests/python/torch2_venv.py) and reuses.
TORCH2_VENV = $(abspath $(BUILD))/torch2-venv
KT_PY2_ENV = KAITIAN_LIBRARY=$(abspath $(BUILD))/libkaitian.so PYTHONPATH=$(CURDIR)/python PYTHON=$(TORCH2_VENV)/bin/python

.PHONY: all build demo demo-bench test test-release test-asan tsan install uninstall deps clean help conformance fuzz chaos soak mutation sweep

all: build

help:
	@echo "make demo     build, then train a CNN on the digits data with DDP over \"kaitian\" (2 ranks)"
	@echo "make demo-bench  a 4-rank job of kaitian bench -c 1 with an explanation of the table"
	@echo "make conformance  torch's own distributed test suite, gloo vs kaitian, 2 and 3 ranks, under Debian's"
	@echo "              torch 1.13 and then torch 2.x from PyPI (~6 min each)"
	@echo "make test     install missing packages, build, run the suite (release, its Python tests under"
	@echo "              torch 1.13 and torch 2.x, then ASan+UBSan)"
	@echo "make tsan     run the suite under ThreadSanitizer"
	@echo "make fuzz     every libFuzzer harness for FUZZ_SECONDS (default 600) each (tests/fuzz/)"
	@echo "make chaos    TRIALS (default 100) jobs of each kind with a rank killed or stopped at random, on one host and on 2 netns hosts (with a host's link taken down) (tests/fault/chaos.sh)"
	@echo "make mutation  plant known bugs one at a time in a copy of the Python package (the exact heterogeneous mean, ZeRO, the pipeline); each must fail its test (tests/mutation/mutate.py, ~2 min)"
	@echo "make sweep    every size 8 B-4 KiB in steps of 8 B and both sides of every tuner threshold, 2 and 4 ranks,"
	@echo "              5 collectives, against Open MPI and MPICH; exits 1 on a cliff (bench/sweep_peers, ~15 min)"
	@echo "make soak     long runs on 4 ranks (one host; 2 netns hosts; 1000 torch groups) whose memory and descriptors must stay flat,"
	@echo "              then SOAK_OVERLOAD_SECONDS (default 600) of jobs on 2 netns hosts with the machine overloaded on purpose:"
	@echo "              no node declared lost, then a node killed and named within 1 s (tests/soak/)"
	@echo "make install  install to PREFIX=$(PREFIX) (library, header, kaitian, pkg-config, CMake package,"
	@echo "              Python package torch_kaitian); make uninstall removes it (docs/install.md)"

deps:
	@missing=""; for p in $(DEB_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi; \
	missing=""; for p in $(DEB_OPTIONAL); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing (optional):$$missing"; \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; } || \
	    echo "note: could not install$$missing; the Slurm and mpirun tests will skip"; \
	fi

build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release
	cmake --build $(BUILD) -j $(JOBS)

demo: build
	$(KT_PY_ENV) $(BUILD)/kaitian run --devices auto+cpu -n 2 examples/train_digits.py

demo-bench: build
	@tools/demo.sh $(BUILD)/kaitian

mutation: build
	$(KT_PY_ENV) $(PYTHON) tests/mutation/mutate.py $(BUILD)/kaitian

conformance: build
	@status=0; \
	echo "== torch 1.13 ($(PYTHON))"; \
	$(KT_PY_ENV) $(PYTHON) tests/python/conformance.py --world-size 2,3 || status=1; \
	echo "== torch 2.x ($(TORCH2_VENV))"; \
	{ /usr/bin/python3 tests/python/torch2_venv.py $(TORCH2_VENV) && \
	  $(KT_PY2_ENV) $(TORCH2_VENV)/bin/python tests/python/conformance.py --world-size 2,3; } || status=1; \
	exit $$status

test: test-release test-asan

test-release: build
	cd $(BUILD) && ctest $(CTEST_FLAGS) -j 1

test-asan: deps
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DKT_SANITIZE_ADDRESS=ON
	cmake --build build-asan -j $(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest $(CTEST_FLAGS) -j 1 -LE no_sanitizer

# The fuzzing campaign: each harness of tests/fuzz/ for FUZZ_SECONDS, over its
# seed corpus and regression inputs; a crash input is kept in build/fuzz/findings.
FUZZ_SECONDS ?= 600
fuzz: build
	@mkdir -p $(BUILD)/fuzz/findings; status=0; \
	for h in $(BUILD)/fuzz/fuzz_*; do \
	  [ -x "$$h" ] || continue; n=$${h##*/fuzz_}; echo "== $$n, $(FUZZ_SECONDS) s"; \
	  KT_FUZZ_KEEP=$(abspath $(BUILD))/fuzz/findings sh tests/fuzz/run.sh "$$h" tests/fuzz/corpus/$$n \
	    tests/fuzz/regress/$$n $(FUZZ_SECONDS) || status=1; \
	done; [ -n "$$(ls $(BUILD)/fuzz/fuzz_* 2>/dev/null)" ] || { echo "no harness built (needs clang with libFuzzer)"; exit 1; }; \
	exit $$status

TRIALS ?= 100
chaos: build
	@status=0; \
	sh tests/fault/chaos.sh $(BUILD)/kaitian $(BUILD)/tests/fault_prog $(TRIALS) 4 || status=1; \
	sh tests/fault/chaos.sh --hosts 2 $(BUILD)/kaitian $(BUILD)/tests/fault_prog $(TRIALS) 4; rc=$$?; \
	[ $$rc = 0 ] || [ $$rc = 77 ] || status=1; \
	exit $$status

sweep: build
	bench/sweep_peers --kaitian $(BUILD)/kaitian $(SWEEP_ARGS)

# The overloaded run's length (tests/soak/overload.sh); `make soak
# SOAK_OVERLOAD_SECONDS=60` for a short one.
SOAK_OVERLOAD_SECONDS ?= 600
soak: build
	@status=0; \
	sh tests/soak/soak.sh $(BUILD)/kaitian $(BUILD)/tests/soak_prog 4 || status=1; \
	sh tests/soak/soak.sh --hosts 2 $(BUILD)/kaitian $(BUILD)/tests/soak_prog 4; rc=$$?; \
	[ $$rc = 0 ] || [ $$rc = 77 ] || status=1; \
	$(KT_PY_ENV) sh tests/soak/soak.sh $(BUILD)/kaitian tests/soak/soak_torch.py 4 groups=1000 || status=1; \
	sh tests/soak/overload.sh $(BUILD)/kaitian $(BUILD)/tests/soak_prog $(SOAK_OVERLOAD_SECONDS); rc=$$?; \
	[ $$rc = 0 ] || [ $$rc = 77 ] || status=1; \
	exit $$status

tsan: deps
	cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DKT_SANITIZE_THREAD=ON
	cmake --build build-tsan -j $(JOBS)
	cd build-tsan && TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 ctest $(CTEST_FLAGS) -j 1 -LE no_sanitizer

install: build
	cmake --install $(BUILD) --prefix $(PREFIX)
	$(PYTHON) python/install.py --prefix $(PREFIX) --manifest $(BUILD)/install_manifest.txt

# Every file of the last `make install` from this build (its manifest: CMake's
# files and the Python package's).
uninstall:
	$(PYTHON) python/install.py --uninstall --manifest $(BUILD)/install_manifest.txt

clean:
	rm -rf build build-asan build-tsan
