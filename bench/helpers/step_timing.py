"""A job's process (`enhancement.training.run`, from the checkout in the working directory) with every training step
timed, for bench/step_overhead:

    python bench/helpers/step_timing.py <run_dir>      (cwd and PYTHONPATH: the checkout to measure)

Each step is timed whole, between the trainer's consecutive step-end callbacks, and within it the model's own work:
transformers' `Trainer.training_step` (forward and backward), its gradient clipping and the optimizer's step. The
rest of the step is the runner's and the trainer's own (data, callbacks, metrics, status files, logging). Both are
wall and CPU time (the thread's), taken in the same step, so the machine's other load weighs on both alike. Patched
by name, so any commit's runner can be measured; on a GPU the model's calls return before the device is done, and
these figures would be the host's alone. Writes <run_dir>/step_timing.json: one [wall, cpu, model wall, model cpu]
per step.
"""

import json
import runpy
import sys
import time
from pathlib import Path


def main() -> None:
    run_dir = Path(sys.argv[1])
    import transformers
    from accelerate.optimizer import AcceleratedOptimizer

    inside = {"wall": 0.0, "cpu": 0.0}
    steps: list[list[float]] = []

    def timed(function):
        def model_work(*args, **kwargs):
            wall, cpu = time.perf_counter(), time.thread_time()
            try:
                return function(*args, **kwargs)
            finally:
                inside["wall"] += time.perf_counter() - wall
                inside["cpu"] += time.thread_time() - cpu
        return model_work

    transformers.Trainer.training_step = timed(transformers.Trainer.training_step)
    transformers.Trainer._clip_grad_norm = timed(transformers.Trainer._clip_grad_norm)
    AcceleratedOptimizer.step = timed(AcceleratedOptimizer.step)

    class StepClock(transformers.TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            self.wall, self.cpu = time.perf_counter(), time.thread_time()
            inside.update(wall=0.0, cpu=0.0)

        def on_step_end(self, args, state, control, **kwargs):
            wall, cpu = time.perf_counter(), time.thread_time()
            steps.append([wall - self.wall, cpu - self.cpu, inside["wall"], inside["cpu"]])
            self.wall, self.cpu = wall, cpu
            inside.update(wall=0.0, cpu=0.0)

    setup = transformers.Trainer.__init__

    def with_clock(self, *args, **kwargs):
        setup(self, *args, **kwargs)
        self.add_callback(StepClock())

    transformers.Trainer.__init__ = with_clock
    sys.argv = ["enhancement.training.run", str(run_dir)]
    try:
        runpy.run_module("enhancement.training.run", run_name="__main__", alter_sys=True)
    finally:
        (run_dir / "step_timing.json").write_text(json.dumps(steps))


if __name__ == "__main__":
    main()
