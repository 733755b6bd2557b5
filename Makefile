# The whole setup on a fresh machine: `make run` and `make test`. See README.md.
.PHONY: run stop test install lock backup

run:
	@scripts/run.sh

stop:
	@scripts/stop.sh

test:
	@scripts/test.sh $(ARGS)

install:
	@scripts/install.sh

# One archive of the instance (database, uploads, indexes, models, keys); ARGS="--output FILE". See README.md.
backup:
	@[ ! -f .run/env ] || . ./.run/env; .venv/bin/python manage.py backup $(ARGS)

# Re-resolve the pinned dependency set after editing pyproject.toml.
lock:
	@scripts/lock.sh
