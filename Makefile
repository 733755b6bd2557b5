# The whole setup on a fresh machine: `make run` and `make test`. See README.md.
.PHONY: run stop test install lock

run:
	@scripts/run.sh

stop:
	@scripts/stop.sh

test:
	@scripts/test.sh $(ARGS)

install:
	@scripts/install.sh

# Re-resolve the pinned dependency set after editing pyproject.toml.
lock:
	@scripts/lock.sh
