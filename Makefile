# Shortcuts. `make run` sets up, builds and generates text; `make test` runs every check.
PROMPT ?= Write a haiku about the sea.
MODEL ?= smollm2
TEMP ?= 0

.PHONY: run test build setup fetch
setup:
	scripts/setup.sh
build: setup
	scripts/build.sh
fetch: setup
	scripts/fetch_model.sh $(MODEL)
run: build fetch
	./build/strata run -m $(MODEL) --chat -p "$(PROMPT)" -n 128 --temp $(TEMP)
test:
	scripts/test.sh
