# transformers imports torchao (int8 exports) on every model load: without quieting these, each process that loads
# a model logs torchao's missing CUDA kernels and torch's pytree deprecations, which say nothing on a CPU node.
# factory.settings quiets them in the Django processes, run.py in a job's own process.
LOGGERS_QUIET_ON_CPU = ("torchao", "torch.utils._pytree")
