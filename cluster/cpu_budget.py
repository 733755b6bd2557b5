"""How a node's cores are shared between kinds of work, so that a chat stays fast while the node ingests, tunes or
trains (issue #49).

Three kinds, in order of who comes first:
- **engines** serving people (llama.cpp and embedding replicas): pinned to the engine cores, each replica to cores
  of its own where there are enough (`assign_engine_cores`), with threads sized to the cores it is given;
- **web and gateway**: the scheduler's default weight;
- **background** work (ingestion's parsing, OCR and embedding, tuning, evaluation, CPU training): it yields
  (`yield_to_interactive`): a higher nice value and SCHED_BATCH, and cgroup v2's `cpu.weight` where the platform
  is given a delegated cgroup (FACTORY_CPU_CGROUP), with torch threads sized to the cores engines leave.

Nice and SCHED_BATCH need no privilege and work everywhere; a process can raise its own nice value but never lower
it again, so only processes that are background for their whole life yield (the ingestion and interactive
workers, a training job's process), never the node worker, whose children are the engines.
"""

import os
from dataclasses import asdict, dataclass
from pathlib import Path

# Environment knobs (settings with sane defaults for 2, 8 and 64 cores; node pages show what they came to).
ENGINE_CORES_ENV = "FACTORY_ENGINE_CORES"
ENGINE_THREADS_ENV = "FACTORY_ENGINE_THREADS"
BACKGROUND_THREADS_ENV = "FACTORY_BACKGROUND_THREADS"
BACKGROUND_NICE_ENV = "FACTORY_BACKGROUND_NICE"
CGROUP_ENV = "FACTORY_CPU_CGROUP"
# Set by scripts/proc.sh for the processes that are background work their whole life.
WORK_KIND_ENV = "FACTORY_WORK_KIND"
BACKGROUND = "background"

DEFAULT_BACKGROUND_NICE = 10
# cgroup v2's default weight is 100: background work gets a fifth of an engine's share of a contended core.
BACKGROUND_CPU_WEIGHT = 20
# llama.cpp's decode of the small models served on CPUs stops scaling at about this many threads.
MAX_DEFAULT_ENGINE_THREADS = 8


class BudgetRefused(ValueError):
    """A setting of the budget that cannot be used, with what is wrong with it."""


@dataclass(frozen=True)
class CpuBudget:
    cores: tuple[int, ...]
    engine_cores: tuple[int, ...]
    engine_threads: int
    background_threads: int
    background_nice: int
    cgroup: str

    def as_dict(self) -> dict:
        return asdict(self)


def usable_cores() -> tuple[int, ...]:
    """The CPUs this process may run on (a container's or taskset's limit, not the machine's count)."""
    return tuple(sorted(os.sched_getaffinity(0)))


def default_engine_cores(cores: tuple[int, ...]) -> tuple[int, ...]:
    """Up to 2 cores everything shares them (engines first by weight); from 4 up, a quarter of the cores (at least
    2) are left to web and background work: 4 → 2 engine cores, 8 → 6, 64 → 48."""
    if len(cores) <= 2:
        return cores
    return cores[:len(cores) - max(2, len(cores) // 4)]


def budget(environ=None, cores: tuple[int, ...] | None = None) -> CpuBudget:
    """This machine's budget: the defaults for its cores, with the FACTORY_* overrides of `environ`."""
    environ = os.environ if environ is None else environ
    cores = usable_cores() if cores is None else cores
    engine_cores = _cpu_list(environ.get(ENGINE_CORES_ENV), cores) or default_engine_cores(cores)
    engine_threads = _positive(environ, ENGINE_THREADS_ENV) or max(
        1, min(MAX_DEFAULT_ENGINE_THREADS, len(engine_cores) // 2))
    background_threads = _positive(environ, BACKGROUND_THREADS_ENV) or max(1, len(cores) - len(engine_cores))
    nice = environ.get(BACKGROUND_NICE_ENV, "")
    if nice and not (nice.lstrip("-").isdigit() and 0 <= int(nice) <= 19):
        raise BudgetRefused(f"{BACKGROUND_NICE_ENV} must be a nice value from 0 to 19, not '{nice}'.")
    return CpuBudget(cores=cores, engine_cores=engine_cores, engine_threads=engine_threads,
                     background_threads=background_threads,
                     background_nice=int(nice) if nice else DEFAULT_BACKGROUND_NICE,
                     cgroup=environ.get(CGROUP_ENV, ""))


def _positive(environ, name: str) -> int | None:
    value = environ.get(name, "")
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        raise BudgetRefused(f"{name} must be a positive whole number, not '{value}'.")
    return int(value)


def _cpu_list(text: str | None, cores: tuple[int, ...]) -> tuple[int, ...]:
    """'0-5,8' (taskset's list format) as CPUs, or a plain count 'N' as the first N usable cores."""
    if not text:
        return ()
    if text.isdigit():
        if not 1 <= int(text) <= len(cores):
            raise BudgetRefused(f"{ENGINE_CORES_ENV}={text}: this machine has {len(cores)} usable cores.")
        return cores[:int(text)]
    chosen = set()
    try:
        for part in text.split(","):
            first, _, last = part.strip().partition("-")
            chosen.update(range(int(first), int(last or first) + 1))
    except ValueError:
        raise BudgetRefused(f"{ENGINE_CORES_ENV} must be a count or a CPU list such as '0-5,8', not '{text}'.")
    if not chosen <= set(cores):
        raise BudgetRefused(f"{ENGINE_CORES_ENV}={text} names CPUs this process may not use "
                            f"(usable: {','.join(map(str, cores))}).")
    return tuple(sorted(chosen))


def assign_engine_cores(threads: int, taken: list[set[int]], plan: CpuBudget) -> tuple[int, ...]:
    """The engine cores a new replica with `threads` threads is pinned to: the least used by the node's other
    replicas (`taken`: each one's CPUs), so that replicas get cores of their own while there are enough and share
    evenly after. Never more cores than the engine cores."""
    use = {core: sum(core in cpus for cpus in taken) for core in plan.engine_cores}
    ranked = sorted(plan.engine_cores, key=lambda core: (use[core], core))
    return tuple(sorted(ranked[:max(1, min(threads, len(ranked)))]))


def shares_cores(cpus: tuple[int, ...], taken: list[set[int]]) -> bool:
    return any(set(cpus) & other for other in taken)


def yield_to_interactive(plan: CpuBudget | None = None) -> None:
    """Make this process (and the processes and threads it starts from now on) background work: nice, batch
    scheduling, and the background cgroup where one is delegated to the platform."""
    plan = plan or budget()
    current = os.getpriority(os.PRIO_PROCESS, 0)
    if plan.background_nice > current:
        os.setpriority(os.PRIO_PROCESS, 0, plan.background_nice)
    # Batch: the scheduler takes it for CPU-bound work and never lets it preempt an engine's thread on wake-up.
    os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    if plan.cgroup:
        join_background_cgroup(Path(plan.cgroup))


def join_background_cgroup(root: Path) -> None:
    """Move this process into `<root>/background`, a cgroup v2 child whose cpu.weight lets engines (in the rest of
    `root`) take a contended core first. `root` must be delegated to the platform's user (systemd's Delegate=yes
    or a container's own cgroup) with the cpu controller enabled for its children."""
    group = root / "background"
    try:
        group.mkdir(exist_ok=True)
        (group / "cpu.weight").write_text(f"{BACKGROUND_CPU_WEIGHT}\n")
        (group / "cgroup.procs").write_text(f"{os.getpid()}\n")
    except OSError as exc:
        raise BudgetRefused(f"{CGROUP_ENV}={root} cannot be used: {exc.strerror} ({exc.filename}). Name a cgroup v2 "
                            f"directory delegated to this user with the cpu controller enabled, or unset it.")


def is_background_process(environ=None) -> bool:
    return (os.environ if environ is None else environ).get(WORK_KIND_ENV) == BACKGROUND
