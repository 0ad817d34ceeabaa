# Shortcuts. `make run` sets up, builds and generates text; `make test` runs every check.
PROMPT ?= The quick brown fox
MODEL ?= tests/fixtures/models/llama

.PHONY: run test build setup
setup:
	scripts/setup.sh
build: setup
	scripts/build.sh
run: build
	./build/strata run -m $(MODEL) -p "$(PROMPT)" -n 64
test:
	scripts/test.sh
