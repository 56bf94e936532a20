# KaiTian front door. `make demo` shows it working, `make test` proves it.
# Everything goes through CMake; build trees live in build/ (release),
# build-asan/ (ASan + UBSan) and build-tsan/ (ThreadSanitizer).

PREFIX ?= /usr/local
JOBS ?= $(shell nproc)
BUILD ?= build
CTEST_FLAGS ?= --output-on-failure
# Debian packages the build and the tests need (installed when missing).
DEB_PACKAGES := gcc make cmake iproute2 procps

.PHONY: all build demo test test-release test-asan tsan install deps clean help

all: build

help:
	@echo "make demo     build, then run a 4-rank job of kaitian bench -c 1 and explain the table"
	@echo "make test     install missing packages, build, run the suite (release, then ASan+UBSan)"
	@echo "make tsan     run the suite under ThreadSanitizer"
	@echo "make install  install to PREFIX=$(PREFIX) (library, header, kaitian, pkg-config, CMake package)"

deps:
	@missing=""; for p in $(DEB_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release
	cmake --build $(BUILD) -j $(JOBS)

demo: build
	@tools/demo.sh $(BUILD)/kaitian

test: test-release test-asan

test-release: build
	cd $(BUILD) && ctest $(CTEST_FLAGS) -j 1

test-asan: deps
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DKT_SANITIZE_ADDRESS=ON
	cmake --build build-asan -j $(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest $(CTEST_FLAGS) -j 1 -LE no_sanitizer

tsan: deps
	cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DKT_SANITIZE_THREAD=ON
	cmake --build build-tsan -j $(JOBS)
	cd build-tsan && TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 ctest $(CTEST_FLAGS) -j 1 -LE no_sanitizer

install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

clean:
	rm -rf build build-asan build-tsan
