"""Where enhancement's files live under FACTORY_DATA_DIR: datasets by the sha256 of their stored form, and each job's
run directory (layout in enhancement/runner.py)."""

from datetime import datetime
from pathlib import Path

from django.conf import settings

SAMPLE_DATASET = Path(__file__).resolve().parent / "samples" / "instructions.jsonl"


def dataset_path(sha256: str) -> Path:
    return Path(settings.DATA_DIR) / "enhancement" / "datasets" / f"{sha256}.jsonl"


def jobs_root() -> Path:
    """Every job's run directory, and so every model file a job produces, lies under this one."""
    return Path(settings.DATA_DIR) / "enhancement" / "jobs"


def converted_bases_dir() -> Path:
    """GGUF bases de-quantized into Hugging Face form, one directory per file version (training/bases.py): rebuilt
    on demand, so backups leave them out."""
    return Path(settings.DATA_DIR) / "enhancement" / "bases"


def run_dir(job_id: int, created_at: datetime) -> Path:
    """Named by the job's id and creation time: a database restored or emptied reuses ids, and a new job must never
    find an older job's checkpoints or result as its own."""
    return jobs_root() / f"{job_id}-{created_at.strftime('%Y%m%dT%H%M%S%f')}"
