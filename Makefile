# The whole setup on a fresh machine: `make run` and `make test`. See README.md.
.PHONY: run stop test test-all install lock backup bundle

run:
	@scripts/run.sh

stop:
	@scripts/stop.sh

test:
	@scripts/test.sh $(ARGS)

# Also the tests marked slow (training, compression and Ray end to end), which `make test` leaves out.
test-all:
	@FACTORY_TEST_SLOW=1 scripts/test.sh $(ARGS)

install:
	@scripts/install.sh

# One archive of the instance (database, uploads, indexes, models, keys); ARGS="--output FILE". See README.md.
backup:
	@[ ! -f .run/env ] || . ./.run/env; .venv/bin/python manage.py backup $(ARGS)

# Re-resolve the pinned dependency set after editing pyproject.toml.
lock:
	@scripts/lock.sh

# One archive for an offline install on a machine like this one (wheels, llama.cpp, Debian packages, installer,
# manifest with checksums): dist/ai-factory-<version>-<arch>.tar.gz. See README "Appliance".
bundle:
	@scripts/bundle.sh
